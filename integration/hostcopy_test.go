package integration

import (
	"bytes"
	"encoding/json"
	"fmt"
	"net/http"
	"strings"
	"testing"

	"stallfree/api"
	"stallfree/internal/testutil"
)

// One crossing per host: jobs reading a group's batch through a node that
// does not own the group get the same bytes; the first read brings the batch
// to that node, the next ones are answered from its copy while the owner
// still counts each job's read (and drops the batch once all have it).
func TestRelayedGroupReadsCrossOncePerHost(t *testing.T) {
	testutil.Long(t)
	nodes := startCluster(t, clusterOpts{nodes: 2})
	dir, _ := dataset(t, 8, 100)
	if code, body, _ := ckReq(t, nodes[0], http.MethodPut, "/v1/datasets/ds", strings.NewReader(`{"source":"`+dir+`"}`), nil); code/100 != 2 {
		t.Fatalf("register: %d %s", code, body)
	}
	if code, body, _ := ckReq(t, nodes[0], http.MethodPut, "/v1/groups/g", strings.NewReader(`{"dataset":"ds","seed":1,"batch_size":2,"jobs":3}`), nil); code/100 != 2 {
		t.Fatalf("group: %d %s", code, body)
	}
	var info api.GroupInfo
	_, body, _ := ckReq(t, nodes[0], http.MethodGet, "/v1/groups/g", nil, nil)
	if err := json.Unmarshal(body, &info); err != nil {
		t.Fatal(err)
	}
	owner, other := nodes[0], nodes[1]
	if info.Owner == nodes[1].name {
		owner, other = nodes[1], nodes[0]
	}
	batch := bytes.Repeat([]byte("staged batch "), 1000)
	if code, body, _ := ckReq(t, owner, http.MethodPut, "/v1/groups/g/epochs/0/batches/0?job=0", bytes.NewReader(batch), nil); code != http.StatusCreated {
		t.Fatalf("stage: %d %s", code, body)
	}
	for job := 1; job <= 2; job++ {
		code, got, _ := ckReq(t, other, http.MethodGet, fmt.Sprintf("/v1/groups/g/epochs/0/batches/0?job=%d&wait=5s", job), nil, nil)
		if code != http.StatusOK || !bytes.Equal(got, batch) {
			t.Fatalf("job %d through %s: %d, %d bytes", job, other.name, code, len(got))
		}
	}
	if _, metrics, _ := ckReq(t, other, http.MethodGet, "/metrics", nil, nil); !bytes.Contains(metrics, []byte("stallfree_group_host_copy_hits_total 1")) {
		t.Fatalf("%s's host copy answered no read:\n%s", other.name, grepLines(metrics, "host_copy"))
	}
	_, body, _ = ckReq(t, owner, http.MethodGet, "/v1/groups/g", nil, nil)
	if err := json.Unmarshal(body, &info); err != nil {
		t.Fatal(err)
	}
	if info.StagedBatches != 0 || info.Jobs[1].Served != 1 || info.Jobs[2].Served != 1 {
		t.Fatalf("the owner did not count both reads (or kept the batch): %+v", info)
	}
}

// A group deleted and defined again stages other batches under the same
// numbers: a node's host copy of a batch of the old definition is never
// served for the new one (the attack round read the old bytes through the
// relaying node, and the owner dropped the new batch as served).
func TestHostCopyOfARedefinedGroupIsNotServed(t *testing.T) {
	testutil.Long(t)
	nodes := startCluster(t, clusterOpts{nodes: 2})
	dir, _ := dataset(t, 8, 100)
	if code, body, _ := ckReq(t, nodes[0], http.MethodPut, "/v1/datasets/ds", strings.NewReader(`{"source":"`+dir+`"}`), nil); code/100 != 2 {
		t.Fatalf("register: %d %s", code, body)
	}
	define := func(seed int) api.GroupInfo {
		t.Helper()
		spec := fmt.Sprintf(`{"dataset":"ds","seed":%d,"batch_size":2,"jobs":2}`, seed)
		if code, body, _ := ckReq(t, nodes[0], http.MethodPut, "/v1/groups/g", strings.NewReader(spec), nil); code != http.StatusCreated {
			t.Fatalf("define: %d %s", code, body)
		}
		var info api.GroupInfo
		_, body, _ := ckReq(t, nodes[0], http.MethodGet, "/v1/groups/g", nil, nil)
		if err := json.Unmarshal(body, &info); err != nil {
			t.Fatal(err)
		}
		return info
	}
	first := define(1)
	owner, other := nodes[0], nodes[1]
	if first.Owner == nodes[1].name {
		owner, other = nodes[1], nodes[0]
	}
	read := func(want []byte, version uint64, query string) {
		t.Helper()
		code, got, h := ckReq(t, other, http.MethodGet, "/v1/groups/g/epochs/0/batches/0?job=1&wait=5s"+query, nil, nil)
		if code != http.StatusOK || !bytes.Equal(got, want) {
			t.Fatalf("job 1 through %s: %d %q; want %q", other.name, code, got, want)
		}
		if v := h.Get(api.HeaderGroupVersion); v != fmt.Sprint(version) {
			t.Fatalf("%s: %q; want %d", api.HeaderGroupVersion, v, version)
		}
	}
	old := []byte("the first definition's batch")
	if code, body, _ := ckReq(t, owner, http.MethodPut, "/v1/groups/g/epochs/0/batches/0?job=0", bytes.NewReader(old), nil); code != http.StatusCreated {
		t.Fatalf("stage: %d %s", code, body)
	}
	// The relaying node keeps a copy for its host. A client's record=1 is
	// not relayed as the node's own record read: the bytes come back, and
	// they are what the copy holds (an empty answer was kept before).
	read(old, first.Version, "&record=1")
	if code, body, _ := ckReq(t, nodes[0], http.MethodDelete, "/v1/groups/g", nil, nil); code != http.StatusNoContent {
		t.Fatalf("delete: %d %s", code, body)
	}
	second := define(2)
	if second.Version == first.Version || second.Owner != owner.name {
		t.Fatalf("redefined: version %d (was %d), owner %s (was %s)", second.Version, first.Version, second.Owner, owner.name)
	}
	fresh := []byte("the second definition's one")
	if code, body, _ := ckReq(t, owner, http.MethodPut, "/v1/groups/g/epochs/0/batches/0?job=0", bytes.NewReader(fresh), nil); code != http.StatusCreated {
		t.Fatalf("stage again: %d %s", code, body)
	}
	// The relaying node's catalog may not show the new definition yet: then
	// its record read names the old version, the owner refuses it (412)
	// without counting, and the batch is relayed whole. Either way: fresh,
	// counted once, and dropped (job 0 made it, job 1 has read it).
	read(fresh, second.Version, "")
	var info api.GroupInfo
	_, body, _ := ckReq(t, owner, http.MethodGet, "/v1/groups/g", nil, nil)
	if err := json.Unmarshal(body, &info); err != nil {
		t.Fatal(err)
	}
	if info.Jobs[1].Served != 1 || info.StagedBatches != 0 {
		t.Fatalf("after one read of the new batch by job 1 of 2: %+v", info)
	}
}
