package httpapi

import (
	"fmt"
	"net/http"
	"os"
	"testing"

	"go.uber.org/goleak"
)

// Every goroutine the server and node start must be gone after the tests,
// except fasthttp's own: its process-wide Date updater, and its worker-pool
// cleaners, which sleep out their interval after a server stops.
//
// The tests' client is http.DefaultClient, whose transport may dial a
// connection for a request that another one, freed first, then carries: the
// spare waits in its idle pool, unused. A server counts an unused
// connection as idle only 5 s after accepting it, so a stop can leave it
// open. Closing the pool first makes the check about the server's and the
// node's goroutines, not the client's.
func TestMain(m *testing.M) {
	code := m.Run()
	http.DefaultClient.CloseIdleConnections()
	if code == 0 {
		if err := goleak.Find(
			goleak.IgnoreAnyFunction("github.com/valyala/fasthttp.updateServerDate.func1"),
			goleak.IgnoreAnyFunction("github.com/valyala/fasthttp.(*workerPool).Start.func2")); err != nil {
			fmt.Fprintf(os.Stderr, "goleak: errors on a successful test run: %v\n", err)
			code = 1
		}
	}
	os.Exit(code)
}
