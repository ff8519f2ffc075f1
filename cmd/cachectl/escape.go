package main

import (
	"fmt"
	"io"
	"strconv"
	"strings"
	"unicode"
	"unicode/utf8"
)

// esc is how cachectl prints a string it got from a node: names, keys,
// stages, sources, members' addresses and error messages come from whoever
// could write to the catalog or the storage, and a terminal obeys escape
// codes in them (colours, cursor moves, a title, a hidden line). Plain text
// prints as it is; a string holding anything a terminal would not show as a
// glyph (controls, DEL, bidi overrides and other format characters, invalid
// UTF-8, which strconv.Quote shows as \xff) prints Go-quoted, so it is visible and inert: "a\x1b[2Jb".
func esc(s string) string {
	if utf8.ValidString(s) && strings.IndexFunc(s, unsafeRune) < 0 {
		return s
	}
	return strconv.Quote(s)
}

// unsafeRune is a rune a terminal may act on rather than show: anything
// but printable characters and the plain space (unicode.IsPrint leaves out
// controls, C1 included, and format characters such as U+202E).
func unsafeRune(r rune) bool { return !unicode.IsPrint(r) }

// safeWriter is cachectl's stdout: whatever a command prints (every table,
// every message) passes through it, so a string that was not run through esc
// still cannot reach the terminal as a control sequence. Tabs and newlines
// pass (they lay out tables); every other unsafe rune is written Go-escaped
// (ESC as \x1b, U+202E as \u202e, an invalid byte as \xff).
type safeWriter struct{ w io.Writer }

func (s safeWriter) Write(p []byte) (int, error) {
	clean := true
	for i := 0; i < len(p) && clean; {
		r, size := utf8.DecodeRune(p[i:])
		clean = !(r == utf8.RuneError && size <= 1) && (r == '\t' || r == '\n' || !unsafeRune(r))
		i += size
	}
	if clean {
		return s.w.Write(p)
	}
	var b strings.Builder
	for i := 0; i < len(p); {
		r, size := utf8.DecodeRune(p[i:])
		switch {
		case r == utf8.RuneError && size <= 1:
			fmt.Fprintf(&b, `\x%02x`, p[i])
		case r == '\t' || r == '\n' || !unsafeRune(r):
			b.WriteRune(r)
		default:
			q := strconv.QuoteRune(r) // '\x1b', '\u202e'
			b.WriteString(q[1 : len(q)-1])
		}
		i += size
	}
	if _, err := io.WriteString(s.w, b.String()); err != nil {
		return 0, err
	}
	return len(p), nil
}
