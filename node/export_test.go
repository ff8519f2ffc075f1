package node

// FreeAddr lends the external tests (follower_test.go, which serves nodes
// through httpapi and so cannot be in this package) the loopback address
// helper.
var FreeAddr = freeAddr
