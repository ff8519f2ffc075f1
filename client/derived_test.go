package client

import (
	"io"
	"net/http"
	"net/http/httptest"
	"testing"

	"github.com/vmihailenco/msgpack/v5"

	"stallfree/api"
)

// An item with nil Data goes as empty bytes, not msgpack's nil, which a node
// refuses as an element without data; the caller's slice is left alone.
func TestPutItemsSendsEmptyItemsAsBytes(t *testing.T) {
	var sent []map[string]any
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		b, _ := io.ReadAll(r.Body)
		if err := msgpack.Unmarshal(b, &sent); err != nil {
			t.Error(err)
		}
		w.Write([]byte(`[{"index":1,"status":201,"bytes":0,"created":true},{"index":2,"status":201,"bytes":1,"created":true}]`))
	}))
	defer srv.Close()
	items := []api.ItemWrite{{Index: 1}, {Index: 2, Data: []byte("x")}}
	if _, err := New(srv.URL, "").PutItems(t.Context(), "dec", items); err != nil {
		t.Fatal(err)
	}
	if data, ok := sent[0]["data"].([]byte); !ok || len(data) != 0 {
		t.Fatalf("an empty item sent as %#v; want empty bytes", sent[0]["data"])
	}
	if items[0].Data != nil {
		t.Fatal("the caller's items were changed")
	}
}
