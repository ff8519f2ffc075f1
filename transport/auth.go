package transport

import (
	"net"

	"stallfree/clusterauth"
)

// ErrAuth means the peer does not hold the cluster key.
var ErrAuth = clusterauth.ErrAuth

const handshakeTTL = clusterauth.TTL

func clientHandshake(c net.Conn, key []byte) error { return clusterauth.Client(c, key) }
func serverHandshake(c net.Conn, key []byte) error { return clusterauth.Server(c, key) }
