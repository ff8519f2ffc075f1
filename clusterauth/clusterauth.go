// Package clusterauth proves, on every connection between nodes (peer
// transport, raft), that both ends hold the cluster key. It is its own
// package because two listeners depend on it and neither may import the
// other.
package clusterauth

import (
	"crypto/hmac"
	"crypto/rand"
	"crypto/sha256"
	"errors"
	"fmt"
	"io"
	"net"
	"time"
)

// The handshake proves to each side that the other holds the cluster key,
// without sending it and without replay (both sides contribute a nonce):
//
//	client → server  magic, client nonce
//	server → client  server nonce, HMAC(key, "server" | cn | sn)
//	client → server  HMAC(key, "client" | cn | sn)
//
// No request is read before the client's proof checks out.
const (
	magic    = "SFP1"
	nonceLen = 32
	macLen   = sha256.Size
	// TTL bounds a whole handshake, so a silent party cannot hold a
	// connection (or an accept slot) open.
	TTL = 2 * time.Second
)

// ErrAuth means the other end does not hold the cluster key.
var ErrAuth = errors.New("peer failed cluster-key authentication")

// Derive separates the keys of different uses (gossip, peer transport,
// raft) derived from one secret, so a proof for one is no proof for another.
// An empty secret gives an empty key.
func Derive(secret []byte, label string) []byte {
	if len(secret) == 0 {
		return nil
	}
	h := sha256.New()
	h.Write([]byte("stallfree/" + label + "/"))
	h.Write(secret)
	return h.Sum(nil)
}

func mac(key []byte, role string, cn, sn []byte) []byte {
	h := hmac.New(sha256.New, key)
	h.Write([]byte(role))
	h.Write(cn)
	h.Write(sn)
	return h.Sum(nil)
}

// Client runs the dialing side of the handshake on c.
func Client(c net.Conn, key []byte) error {
	c.SetDeadline(time.Now().Add(TTL))
	defer c.SetDeadline(time.Time{})
	cn := make([]byte, nonceLen)
	rand.Read(cn)
	if _, err := c.Write(append([]byte(magic), cn...)); err != nil {
		return err
	}
	buf := make([]byte, nonceLen+macLen)
	if _, err := io.ReadFull(c, buf); err != nil {
		return fmt.Errorf("%w: %w", ErrAuth, err)
	}
	sn, smac := buf[:nonceLen], buf[nonceLen:]
	if !hmac.Equal(smac, mac(key, "server", cn, sn)) {
		return ErrAuth
	}
	_, err := c.Write(mac(key, "client", cn, sn))
	return err
}

// Server runs the accepting side of the handshake on c; nothing else may be
// read from c before it returns nil.
func Server(c net.Conn, key []byte) error {
	c.SetDeadline(time.Now().Add(TTL))
	defer c.SetDeadline(time.Time{})
	buf := make([]byte, len(magic)+nonceLen)
	if _, err := io.ReadFull(c, buf); err != nil {
		return err
	}
	if string(buf[:len(magic)]) != magic {
		return fmt.Errorf("%w: not a Stallfree node", ErrAuth)
	}
	cn := buf[len(magic):]
	sn := make([]byte, nonceLen)
	rand.Read(sn)
	if _, err := c.Write(append(sn, mac(key, "server", cn, sn)...)); err != nil {
		return err
	}
	cmac := make([]byte, macLen)
	if _, err := io.ReadFull(c, cmac); err != nil {
		return err
	}
	if !hmac.Equal(cmac, mac(key, "client", cn, sn)) {
		return ErrAuth
	}
	return nil
}

// Dial connects to addr and proves the key, as a member does.
func Dial(addr string, timeout time.Duration, key []byte) (net.Conn, error) {
	c, err := net.DialTimeout("tcp", addr, timeout)
	if err != nil {
		return nil, err
	}
	if err := Client(c, key); err != nil {
		c.Close()
		return nil, err
	}
	return c, nil
}
