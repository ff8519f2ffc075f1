package clusterauth

import (
	"errors"
	"testing"
	"time"
)

// A request proof holds for its method, path and sender, within the skew,
// under the key it was made with, and for nothing else.
func TestRequestProof(t *testing.T) {
	key := Derive([]byte("secret"), "http")
	now := time.Unix(1_800_000_000, 0)
	proof := SignRequest(key, "POST", "/v1/internal/x?to=a", "n1", now)
	if err := VerifyRequest(key, "POST", "/v1/internal/x?to=a", "n1", proof, now.Add(RequestSkew)); err != nil {
		t.Fatalf("a fresh proof: %v", err)
	}
	for name, err := range map[string]error{
		"other key":    VerifyRequest(Derive([]byte("other"), "http"), "POST", "/v1/internal/x?to=a", "n1", proof, now),
		"other method": VerifyRequest(key, "GET", "/v1/internal/x?to=a", "n1", proof, now),
		"other path":   VerifyRequest(key, "POST", "/v1/internal/x?to=b", "n1", proof, now),
		"other sender": VerifyRequest(key, "POST", "/v1/internal/x?to=a", "n2", proof, now),
		"too old":      VerifyRequest(key, "POST", "/v1/internal/x?to=a", "n1", proof, now.Add(RequestSkew+time.Second)),
		"from ahead":   VerifyRequest(key, "POST", "/v1/internal/x?to=a", "n1", proof, now.Add(-RequestSkew-time.Second)),
		"none":         VerifyRequest(key, "POST", "/v1/internal/x?to=a", "n1", "", now),
		"garbage":      VerifyRequest(key, "POST", "/v1/internal/x?to=a", "n1", "12.zz", now),
	} {
		if !errors.Is(err, ErrAuth) {
			t.Errorf("%s: %v; want ErrAuth", name, err)
		}
	}
}
