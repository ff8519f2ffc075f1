package transport

import (
	"testing"

	"go.uber.org/goleak"
)

// Every connection, reader loop and handler must be gone once clients and
// servers are closed.
func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }
