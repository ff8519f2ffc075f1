package main

import (
	"fmt"
	"log/slog"
	"math"
	"time"

	"stallfree/checkpoint"
	"stallfree/node"
	"stallfree/source"
)

// startCheckpoints starts the checkpoint service (checkpoints in peer
// memory) over the node's catalog and members.
func startCheckpoints(n *node.Node, memory string, keep int, persist string, deadGrace time.Duration, local bool,
	log *slog.Logger, s3 source.S3Config, shmDir, shmTag string) (*checkpoint.Service, error) {
	mem, err := parseSize("checkpoint-memory", memory, 0, math.MaxInt64, "a size such as 2GiB (IEC units; 0 refuses every part)")
	if err != nil {
		return nil, err
	}
	if keep < 1 {
		return nil, fmt.Errorf("--checkpoint-keep %d: want at least 1", keep)
	}
	if deadGrace < 0 {
		return nil, fmt.Errorf("--dead-grace %v: want a positive duration", deadGrace)
	}
	tick := time.Second
	if deadGrace == 0 {
		deadGrace = time.Minute
		if local {
			deadGrace = 5 * time.Second
		}
	}
	if local {
		tick = 300 * time.Millisecond
	}
	view := n.MemberView()
	svc, err := checkpoint.New(checkpoint.Config{Self: n.Name(), Memory: mem, Keep: keep, Persist: persist, S3: s3,
		Relay: n.Control().Relay(), DeadGrace: deadGrace, Tick: tick, Logger: log,
		ShmDir: shmDir, ShmTag: shmTag}, view.Catalog(), view)
	if err != nil {
		return nil, err
	}
	// The checkpoints' ages on /metrics (the dashboard and the persist alert).
	if err := n.Registry().Register(svc); err != nil {
		svc.Close()
		return nil, err
	}
	return svc, nil
}
