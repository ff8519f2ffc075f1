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
// segments, appended to into (a caller's array, so that a hit allocates
// nothing for them), and returns the path they were cut from. fasthttp's
// ctx.Path() resolves "..", "%2F" and friends before we see them, which would
// let a request name a key it never spelled out; the original path keeps
// every segment as sent.
func splitPath(orig []byte, into []string) (string, []string) {
	p := string(orig) // segments outlive fasthttp's buffer (names, errors)
	if i := strings.IndexByte(p, '?'); i >= 0 {
		p = p[:i]
	}
	p = strings.TrimPrefix(p, "/")
	if p == "" {
		return p, into[:0]
	}
	seg, rest := into[:0], p
	for {
		i := strings.IndexByte(rest, '/')
		if i < 0 {
			return p, append(seg, rest)
		}
		seg, rest = append(seg, rest[:i]), rest[i+1:]
	}
}

// lastSegments is strings.Join(tail, "/") without building it: tail must be
// the last segments splitPath cut from p, so their joined text is p's end.
func lastSegments(p string, tail []string) string {
	n := len(tail) - 1 // the slashes between them
	for _, s := range tail {
		n += len(s)
	}
	return p[len(p)-max(n, 0):]
}

// decodeKey unescapes the raw key of an items/ route (its segments joined by
// their slashes) and validates the result as a manifest key.
func decodeKey(raw string) (string, error) {
	key, err := url.PathUnescape(raw)
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
