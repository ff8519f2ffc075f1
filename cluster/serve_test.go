package cluster

import (
	"context"
	"errors"
	"strings"
	"testing"

	"github.com/cespare/xxhash/v2"

	"stallfree/store"
	"stallfree/transport"
)

// The edges of a peer's request: an inline request is answered only for a
// dataset version this node has and items it holds, and otherwise left to
// a goroutine (ErrWouldBlock); an inline handoff under another ring too; an
// index equal to the item count is out of range for a get, inline or not,
// and a push alike.
func TestServePeerEdges(t *testing.T) {
	c, d, st, local := oneMember(t, 4, 100)
	for _, i := range []uint32{0, 1} {
		if err := st.Put(store.MakeKey(d.ID, i), local.items[int(i)], xxhash.Sum64(local.items[int(i)])); err != nil {
			t.Fatal(err)
		}
	}
	serve := func(req transport.Request) ([]transport.Item, error) {
		if req.Dataset == "" {
			req.Dataset = d.Name
		}
		if req.DatasetVersion == 0 {
			req.DatasetVersion = d.Version
		}
		items, err := c.servePeer(context.Background(), &req)
		for _, it := range items {
			if it.Release != nil {
				it.Release()
			}
		}
		return items, err
	}
	items, err := serve(transport.Request{Indices: []uint32{0, 1}, Inline: true})
	if err != nil || !items[0].Found || string(items[1].Data) != string(local.items[1]) {
		t.Fatalf("inline, every item resident: %v", err)
	}
	for name, req := range map[string]transport.Request{
		"an item not resident":         {Indices: []uint32{0, 2}, Inline: true},
		"another dataset version":      {DatasetVersion: d.Version + 1, Indices: []uint32{0}, Inline: true},
		"an unknown dataset":           {Dataset: "nope", Indices: []uint32{0}, Inline: true},
		"a handoff under another ring": {Indices: []uint32{0}, Inline: true, Handoff: true, Ring: c.ring().Version() + 1},
	} {
		if _, err := serve(req); !errors.Is(err, transport.ErrWouldBlock) {
			t.Errorf("inline, %s: %v, want ErrWouldBlock", name, err)
		}
	}
	if local.fills != 0 {
		t.Fatalf("inline requests made %d fills", local.fills)
	}
	// Refused before the fill: a node's fill would index its manifest. An
	// inline request too, at once: a goroutine would only refuse it later.
	for _, inline := range []bool{false, true} {
		if _, err := serve(transport.Request{Indices: []uint32{0, 4}, Inline: inline}); err == nil || !strings.Contains(err.Error(), "out of range") || local.fills != 0 {
			t.Fatalf("a get of index 4 of 4 (inline %v): %v after %d fills, want out of range before any", inline, err, local.fills)
		}
	}
	b := local.items[3]
	if _, err := serve(transport.Request{Indices: []uint32{4}, Push: true, Ring: c.ring().Version(), Data: [][]byte{b}, Sums: []uint64{xxhash.Sum64(b)}}); err == nil {
		t.Fatal("a push of index 4 of 4 was taken")
	}
	if n := st.Stats().Items; n != 2 {
		t.Fatalf("%d items stored after refused requests, want the 2 put", n)
	}
}
