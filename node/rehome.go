package node

import (
	"context"
	"time"

	"stallfree/catalog"
	"stallfree/store"
)

// rehomeLoop moves what this node holds but no longer owns to the owner,
// once membership has settled. A handoff moves an item on its new owner's
// first use, from the one previous owner; after members come and go several
// times, copies left on owners of older rings are never asked for (requests
// go to the owner) and hold memory the cluster counts on to keep each item
// once. sweepSchedule says which ticks sweep.
func (n *Node) rehomeLoop(every time.Duration) {
	defer n.wg.Done()
	t := time.NewTicker(every)
	defer t.Stop()
	var s sweepSchedule
	for {
		select {
		case <-n.ctx.Done():
			return
		case <-t.C:
		}
		r := n.peers.Ring()
		if r == nil || !n.peers.Joined() {
			continue
		}
		if s.due(r.Version()) {
			_, complete := n.rehome(n.ctx)
			s.swept(complete)
			n.rewarm()
		}
	}
}

// sweepAgain is how many ticks after a complete sweep the loop sweeps once
// more: a fetch or handoff begun under the previous ring can still cache an
// item after the first sweep.
const sweepAgain = 10

// sweepSchedule decides, tick by tick, when rehomeLoop sweeps: once the ring
// has stayed the same for a tick, on every tick after that until a sweep
// completes, and once more sweepAgain ticks later.
type sweepSchedule struct {
	// Versions name member sets, so a ring can come back to a version swept
	// before (members leave and return): what calls for a sweep is a change
	// since the last one, not an unseen version.
	seen       uint64
	known      bool // seen holds a version: any uint64 may name a ring
	changed    bool
	ticksSince int
}

// due tells whether this tick, with the ring at version v, sweeps.
func (s *sweepSchedule) due(v uint64) bool {
	s.ticksSince++
	switch {
	case !s.known || v != s.seen:
		s.seen, s.known, s.changed = v, true, true // still moving, or just moved: look again next tick
		return false
	case s.changed:
		return true
	default:
		return s.ticksSince == sweepAgain
	}
}

// swept records whether a due sweep completed: one that did after a change
// starts the count to the extra sweep; one that did not is tried again on
// the next tick.
func (s *sweepSchedule) swept(complete bool) {
	if s.changed && complete {
		s.changed, s.ticksSince = false, 0
	}
}

// rewarm warms again, under the settled ring, every dataset this node has
// warmed: items whose owner changed during or after a warm-up were left
// to the new owner, whose own warm-up may have ended before it owned them.
// Items already held are skipped, so this reads only what is missing. A
// warm-up still running, failed, or stopped by a full store is left alone.
func (n *Node) rewarm() {
	for _, d := range n.cat.Datasets() {
		n.mu.Lock()
		w, ok := n.warmups[d.Name]
		n.mu.Unlock()
		if !ok || w.version != d.Version || d.Manifest.IsTar() {
			continue
		}
		if p := w.progress(); !p.Running && !p.Full && p.Error == "" {
			n.StartWarmup(d)
		}
	}
}

// rehome pushes every item held here that another member owns to that
// member and drops the local copy once the owner holds it, and says how many
// moved. Incomplete when a push failed (the owner was busy or saw another
// ring): the next tick tries again.
func (n *Node) rehome(ctx context.Context) (moved int, complete bool) {
	complete = true
	for _, d := range n.cat.Datasets() {
		byOwner := map[string][]int{}
		for i := range d.Manifest.Len() {
			if !n.store.Contains(store.MakeKey(d.ID, uint32(i))) {
				continue
			}
			if owner, self := n.peers.Owner(d, i); !self {
				byOwner[owner] = append(byOwner[owner], i)
			}
		}
		for owner, idx := range byOwner {
			for len(idx) > 0 && ctx.Err() == nil {
				m, ok := n.pushCopies(ctx, owner, d, &idx)
				moved += m
				if !ok {
					complete = false
					break
				}
			}
		}
	}
	if moved > 0 {
		n.log.Info("moved copies left by earlier rings to their owners", "items", moved)
	}
	return moved, complete && ctx.Err() == nil
}

// pushCopies sends the first batch of *idx to owner (bounded as a tar
// warm-up's pushes are), advances *idx past it,
// and deletes the items the owner now holds.
func (n *Node) pushCopies(ctx context.Context, owner string, d *catalog.Dataset, idx *[]int) (int, bool) {
	var batch []int
	var data [][]byte
	var release []func()
	defer func() {
		for _, r := range release {
			r()
		}
	}()
	size, used := 0, 0
	for _, i := range *idx {
		if len(batch) == pushItems || (len(batch) > 0 && size+int(d.Manifest.Size(i)) > pushBytes) {
			break
		}
		used++
		ref, ok := n.store.Get(store.MakeKey(d.ID, uint32(i)))
		if !ok {
			continue // evicted or handed off meanwhile
		}
		batch, data, release = append(batch, i), append(data, ref.Data), append(release, ref.Release)
		size += len(ref.Data)
	}
	*idx = (*idx)[used:]
	if len(batch) == 0 {
		return 0, true
	}
	kept, err := n.peers.PushToOwner(ctx, owner, d, batch, data)
	if err != nil {
		n.log.Debug("moving copies to their owner", "owner", owner, "dataset", d.Name, "err", err)
		return 0, false
	}
	moved := 0
	for j, ok := range kept {
		if ok && n.store.Delete(store.MakeKey(d.ID, uint32(batch[j]))) {
			moved++
		}
	}
	return moved, true
}
