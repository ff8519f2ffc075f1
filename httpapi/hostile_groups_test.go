package httpapi

import (
	"encoding/json"
	"strconv"
	"testing"
	"time"

	"stallfree/api"
	"stallfree/clusterauth"
	"stallfree/groups"
	"stallfree/node"
)

// Waiting group reads are bounded per node: past MaxGroupWaits a read that
// would wait is answered 503 with Retry-After at once, and the slots come
// back as the waits end.
func TestWaitingGroupReadsAreBounded(t *testing.T) {
	dir, files := writeDataset(t, 8, 10)
	h := startOn(t, dir, files, 1<<20, "lru", "", func(s *Server, n *node.Node) {
		s.MaxGroupWaits = 2
		g := groups.New(n.GroupHost(), groups.Config{Timeout: time.Hour, MaxBatchBytes: 1 << 20, Relay: n.Control().Relay()})
		t.Cleanup(g.Close)
		s.EnableGroups(g)
	})
	if r := h.do("PUT", "/v1/groups/g", []byte(`{"dataset":"ds","seed":1,"batch_size":1,"jobs":3}`)); r.status != 201 {
		t.Fatalf("group: %d %s", r.status, r.body)
	}
	// Batch 0 is job 0's to make: jobs 1 and 2 wait for it.
	done := make(chan reply, 2)
	for _, job := range []string{"1", "2"} {
		go func() { done <- h.do("GET", "/v1/groups/g/epochs/0/batches/0?wait=20s&job="+job, nil) }()
	}
	// Both are waiting once the group has seen them (a read takes its slot
	// first).
	deadline := time.Now().Add(10 * time.Second)
	for {
		var info struct {
			Jobs []struct {
				Seen bool `json:"seen"`
			} `json:"jobs"`
		}
		json.Unmarshal(h.do("GET", "/v1/groups/g", nil).body, &info)
		if len(info.Jobs) == 3 && info.Jobs[1].Seen && info.Jobs[2].Seen {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("the two reads never waited: %+v", info)
		}
	}
	third := h.do("GET", "/v1/groups/g/epochs/0/batches/1?wait=20s&job=2", nil)
	if third.status != 503 || third.header.Get("Retry-After") == "" {
		t.Fatalf("a third waiting read with two waiting: %d %s (Retry-After %q)", third.status, third.body, third.header.Get("Retry-After"))
	}
	if r := h.do("PUT", "/v1/groups/g/epochs/0/batches/0?job=0", []byte("batch zero")); r.status != 201 {
		t.Fatalf("staging batch 0: %d %s", r.status, r.body)
	}
	for range 2 {
		if r := <-done; r.status != 200 || string(r.body) != "batch zero" {
			t.Fatalf("a waiting read: %d %s", r.status, r.body)
		}
	}
	if r := h.do("GET", "/v1/groups/g/epochs/0/batches/1?wait=1ms&job=2", nil); r.status != 404 {
		t.Fatalf("a waiting read once the slots are back: %d %s", r.status, r.body)
	}
}

// A record read (a relaying node's host copy answering a job) names the
// version of the definition its copy is of: any other version is refused
// with 412 before the read counts, and a read of the right one is counted
// and answered without bytes. Every answer names the version.
func TestRecordReadOfAnotherVersionCountsNothing(t *testing.T) {
	dir, files := writeDataset(t, 8, 10)
	h := startOn(t, dir, files, 1<<20, "lru", "", func(s *Server, n *node.Node) {
		g := groups.New(n.GroupHost(), groups.Config{Timeout: time.Hour, MaxBatchBytes: 1 << 20, Relay: n.Control().Relay()})
		t.Cleanup(g.Close)
		s.EnableGroups(g)
	})
	if r := h.do("PUT", "/v1/groups/g", []byte(`{"dataset":"ds","seed":1,"batch_size":1,"jobs":3}`)); r.status != 201 {
		t.Fatalf("group: %d %s", r.status, r.body)
	}
	var info struct {
		Version uint64 `json:"version"`
		Jobs    []struct {
			Served int `json:"served"`
		} `json:"jobs"`
	}
	served := func() []int {
		json.Unmarshal(h.do("GET", "/v1/groups/g", nil).body, &info)
		var n []int
		for _, j := range info.Jobs {
			n = append(n, j.Served)
		}
		return n
	}
	served()
	version := strconv.FormatUint(info.Version, 10)
	if r := h.do("PUT", "/v1/groups/g/epochs/0/batches/0?job=0", []byte("batch zero")); r.status != 201 {
		t.Fatalf("staging: %d %s", r.status, r.body)
	}
	for _, bad := range []string{"&version=x", "&version=-1", "&version=18446744073709551616"} {
		if r := h.do("GET", "/v1/groups/g/epochs/0/batches/0?job=1"+bad, nil); r.status != 400 {
			t.Fatalf("%s: %d %s", bad, r.status, r.body)
		}
	}
	// A record read is a member's relay: signed as node t1.
	asMember := func(target string) reply {
		proof := clusterauth.SignRequest(h.node.MemberKey(), "GET", target, "t1", time.Now())
		return h.do("GET", target, nil, api.HeaderForwarded, "t1", clusterauth.HeaderMember, proof)
	}
	stale := strconv.FormatUint(info.Version+1, 10)
	if r := asMember("/v1/groups/g/epochs/0/batches/0?job=1&record=1&version=" + stale); r.status != 412 {
		t.Fatalf("a record read of version %s: %d %s", stale, r.status, r.body)
	}
	if got := served(); got[1] != 0 {
		t.Fatalf("a refused record read was counted: served %v", got)
	}
	r := asMember("/v1/groups/g/epochs/0/batches/0?job=1&record=1&version=" + version)
	if r.status != 200 || len(r.body) != 0 || r.header.Get(api.HeaderGroupVersion) != version {
		t.Fatalf("a record read of the current version: %d %q, version %q", r.status, r.body, r.header.Get(api.HeaderGroupVersion))
	}
	// A client's record=1 is a plain read: the bytes (a relaying node kept
	// an empty answer to one as the batch for its whole host).
	if r := h.do("GET", "/v1/groups/g/epochs/0/batches/0?job=1&record=1", nil); r.status != 200 || string(r.body) != "batch zero" {
		t.Fatalf("a client's record read: %d %q", r.status, r.body)
	}
	r = h.do("GET", "/v1/groups/g/epochs/0/batches/0?job=2", nil)
	if r.status != 200 || string(r.body) != "batch zero" || r.header.Get(api.HeaderGroupVersion) != version {
		t.Fatalf("a plain read: %d %q, version %q", r.status, r.body, r.header.Get(api.HeaderGroupVersion))
	}
	if got := served(); got[1] != 1 || got[2] != 1 {
		t.Fatalf("served %v; want jobs 1 and 2 counted once", got)
	}
}
