package httpapi

import (
	"testing"

	"go.uber.org/goleak"
)

// Every goroutine the server and node start must be gone after the tests,
// except fasthttp's own: its process-wide Date updater, and its worker-pool
// cleaners, which sleep out their interval after a server stops.
func TestMain(m *testing.M) {
	goleak.VerifyTestMain(m,
		goleak.IgnoreAnyFunction("github.com/valyala/fasthttp.updateServerDate.func1"),
		goleak.IgnoreAnyFunction("github.com/valyala/fasthttp.(*workerPool).Start.func2"))
}
