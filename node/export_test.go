package node

// The external tests (follower_test.go, which serves nodes through httpapi
// and so cannot be in this package) share this package's helpers.
var (
	FreeAddr = freeAddr
	Await    = await
)
