package clusterauth

import (
	"crypto/hmac"
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"strconv"
	"strings"
	"time"
)

// HeaderMember carries a member's proof on an HTTP request between nodes
// (the /v1/internal routes): the API token alone lets any client in, so
// routes that act on a node's own copies also want the cluster key.
const HeaderMember = "X-Stallfree-Member"

// RequestSkew bounds how far a proof's time may be from the receiver's
// clock, and so how long a captured proof could be replayed (for the same
// method and path only).
const RequestSkew = 2 * time.Minute

// SignRequest is the HeaderMember value for a request, made at now by
// member from, with the key Derive(secret, "http") gives.
func SignRequest(key []byte, method, path, from string, now time.Time) string {
	ts := strconv.FormatInt(now.Unix(), 10)
	return ts + "." + hex.EncodeToString(requestMAC(key, method, path, from, ts))
}

// VerifyRequest checks a HeaderMember value (proof) for a request.
func VerifyRequest(key []byte, method, path, from, proof string, now time.Time) error {
	ts, sum, ok := strings.Cut(proof, ".")
	if !ok {
		return fmt.Errorf("%w: no member proof", ErrAuth)
	}
	sec, err := strconv.ParseInt(ts, 10, 64)
	if err != nil {
		return fmt.Errorf("%w: malformed member proof", ErrAuth)
	}
	if d := now.Sub(time.Unix(sec, 0)); d > RequestSkew || d < -RequestSkew {
		return fmt.Errorf("%w: member proof is %v from this node's clock", ErrAuth, d.Round(time.Second))
	}
	got, err := hex.DecodeString(sum)
	if err != nil || !hmac.Equal(got, requestMAC(key, method, path, from, ts)) {
		return fmt.Errorf("%w: wrong member proof", ErrAuth)
	}
	return nil
}

func requestMAC(key []byte, method, path, from, ts string) []byte {
	h := hmac.New(sha256.New, key)
	for _, s := range []string{"http", method, path, from, ts} {
		h.Write([]byte(s))
		h.Write([]byte{0})
	}
	return h.Sum(nil)
}
