package httpapi

import (
	"fmt"
	"net/url"
	"strings"

	"stallfree/source"
)

// validName checks dataset and job names: they appear in paths and metrics,
// so they are kept to a safe alphabet. (Checked by hand: it runs on every
// request, and a regexp cost 2% of a cache hit's CPU.)
func validName(kind, s string) error {
	ok := len(s) >= 1 && len(s) <= 128
	for i := 0; ok && i < len(s); i++ {
		c := s[i]
		alnum := c >= 'a' && c <= 'z' || c >= 'A' && c <= 'Z' || c >= '0' && c <= '9'
		ok = alnum || i > 0 && (c == '.' || c == '_' || c == '-')
	}
	if !ok {
		return fmt.Errorf("invalid %s name %q: want 1-128 of [A-Za-z0-9._-], starting with a letter or digit", kind, s)
	}
	return nil
}

// splitPath cuts the request's original (un-normalized) path into raw
// segments. fasthttp's ctx.Path() resolves "..", "%2F" and friends before we
// see them, which would let a request name a key it never spelled out; the
// original path keeps every segment as sent.
func splitPath(orig []byte) []string {
	p := string(orig)
	if i := strings.IndexByte(p, '?'); i >= 0 {
		p = p[:i]
	}
	p = strings.TrimPrefix(p, "/")
	if p == "" {
		return nil
	}
	return strings.Split(p, "/")
}

// decodeKey unescapes the raw key segments of an items/ route and validates
// the result as a manifest key.
func decodeKey(raw []string) (string, error) {
	key, err := url.PathUnescape(strings.Join(raw, "/"))
	if err != nil {
		return "", fmt.Errorf("%w: %w", source.ErrBadKey, err)
	}
	if err := source.ValidKey(key); err != nil {
		return "", err
	}
	return key, nil
}

func decodeSegment(kind, raw string) (string, error) {
	s, err := url.PathUnescape(raw)
	if err != nil {
		return "", fmt.Errorf("invalid %s in path: %w", kind, err)
	}
	return s, validName(kind, s)
}
