package main

import "testing"

func TestPlural(t *testing.T) {
	for n, want := range map[int]string{0: "0 ranks", 1: "1 rank", 3: "3 ranks"} {
		if got := plural(n, "rank"); got != want {
			t.Errorf("plural(%d) = %q, want %q", n, got, want)
		}
	}
}
