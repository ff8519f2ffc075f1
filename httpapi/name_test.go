package httpapi

import (
	"regexp"
	"testing"
)

// validName is checked by hand on the hot path; the regexp states the rule.
func FuzzValidName(f *testing.F) {
	re := regexp.MustCompile(`^[A-Za-z0-9][A-Za-z0-9._-]{0,127}$`)
	for _, s := range []string{"a", "-a", "a-", ".", "", "abc.def_g-h", "ü", "a b"} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, s string) {
		if (validName("x", s) == nil) != re.MatchString(s) {
			t.Fatalf("%q disagrees", s)
		}
	})
}
