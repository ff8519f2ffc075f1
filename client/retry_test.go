package client

import (
	"net/http"
	"net/http/httptest"
	"sync/atomic"
	"testing"
	"time"
)

// A node whose catalog is catching up answers 503 with Retry-After for a
// while, more often than a fixed number of retries allows: the client keeps
// backing off until it answers.
func TestDoRetries503WithBackoffUntilItAnswers(t *testing.T) {
	var calls atomic.Int32
	const busy = 10
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if calls.Add(1) <= busy {
			w.Header().Set("Retry-After", "0")
			w.WriteHeader(http.StatusServiceUnavailable)
			w.Write([]byte(`{"error":"catalog not caught up yet"}`))
			return
		}
		w.Write([]byte(`[{"name":"imgs"}]`))
	}))
	defer srv.Close()
	c := New(srv.URL, "")
	c.busyBackoff = time.Millisecond
	ds, err := c.Datasets(t.Context())
	if err != nil {
		t.Fatalf("after %d calls: %v", calls.Load(), err)
	}
	if len(ds) != 1 || ds[0].Name != "imgs" || calls.Load() != busy+1 {
		t.Fatalf("got %v after %d calls, want imgs after %d", ds, calls.Load(), busy+1)
	}
}

// A 503 without Retry-After (no raft leader) is not retried.
func TestDo503WithoutRetryAfterIsAnError(t *testing.T) {
	var calls atomic.Int32
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		calls.Add(1)
		w.WriteHeader(http.StatusServiceUnavailable)
		w.Write([]byte(`{"error":"no raft leader"}`))
	}))
	defer srv.Close()
	_, err := New(srv.URL, "").Datasets(t.Context())
	if e, ok := err.(*Error); !ok || e.Status != 503 || e.Message != "no raft leader" || calls.Load() != 1 {
		t.Fatalf("err %v after %d calls, want the 503 after 1", err, calls.Load())
	}
}
