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
