package main

import (
	"bytes"
	"context"
	"encoding/json"
	"net"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"

	"stallfree/api"
)

// fakeNode answers cachectl's reads with what a hostile catalog could hold:
// names, a stage, a source, member fields and an error message carrying
// escape codes, BEL, a C1 control, a newline and a bidi override.
func fakeNode(t *testing.T) string {
	t.Helper()
	quota := uint64(2 << 30)
	latest := uint64(7)
	written := 3
	bodies := map[string]any{
		"/v1/datasets": []api.Dataset{
			{Name: "imgs\x1b[2J", Source: "dir:///data/\x1b]0;owned\x07", Items: 10, Bytes: 1000, Version: 4, Quota: &quota},
			{Name: "dec", DerivedFrom: "imgs", Stage: "red\x1b[31m\nfake row\u202e", Items: 10, Version: 5, Written: &written},
		},
		"/v1/cluster": api.Cluster{Self: "n1\x1b[8m", Leader: "n1", Members: []api.Member{
			{Name: "n1\x1b[8m", State: "alive", HTTP: "127.0.0.1:1\a", Peer: "p\u009b1m"}}},
		"/v1/checkpoints": []api.Checkpoint{{Name: "ck\x1b[1A", Latest: &latest, Steps: []api.CheckpointStep{
			{Step: 7, Bytes: 4096, Parts: []string{"0", "1", "2"}, Replicas: 2}}}},
	}
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.URL.Path == "/v1/datasets/imgs/warmup" {
			w.WriteHeader(http.StatusConflict)
			json.NewEncoder(w).Encode(map[string]string{"error": "source changed: a\x1b[2Kb"})
			return
		}
		b, ok := bodies[r.URL.Path]
		if !ok {
			http.NotFound(w, r)
			return
		}
		json.NewEncoder(w).Encode(b)
	}))
	t.Cleanup(srv.Close)
	return srv.URL
}

// Issue 46: nothing a node sends reaches the terminal as a control
// sequence. Every table and message escapes what came from the node (an
// escaped string prints Go-quoted, "a\x1b[2Jb"), and stdout as a whole
// passes through a filter that escapes whatever a command forgot.
func TestUntrustedStringsPrintEscaped(t *testing.T) {
	node := fakeNode(t)
	for _, c := range []struct {
		args []string
		want []string
	}{
		{[]string{"datasets", "ls"}, []string{`"imgs\x1b[2J"`, `"dir:///data/\x1b]0;owned\a"`, `stage "red\x1b[31m\nfake row\u202e"`}},
		{[]string{"members"}, []string{`"n1\x1b[8m"`, `"127.0.0.1:1\a"`, `"p\u009b1m"`}},
		{[]string{"checkpoints", "ls"}, []string{`"ck\x1b[1A"`}},
	} {
		var out bytes.Buffer
		if err := run(context.Background(), append([]string{"--node", node}, c.args...), &out); err != nil {
			t.Fatalf("%v: %v", c.args, err)
		}
		got := out.String()
		if i := strings.IndexFunc(got, func(r rune) bool { return r != '\n' && r != '\t' && unsafeRune(r) }); i >= 0 {
			t.Fatalf("%v printed a raw control character at %d:\n%q", c.args, i, got)
		}
		if strings.Contains(got, "\nfake row") {
			t.Fatalf("%v: a newline in a stage started a row of its own:\n%s", c.args, got)
		}
		for _, w := range c.want {
			if !strings.Contains(got, w) {
				t.Errorf("%v: output lacks %s:\n%s", c.args, w, got)
			}
		}
	}
	// An error message from the node is escaped too (main prints it).
	err := run(context.Background(), []string{"--node", node, "warmup", "imgs"}, &bytes.Buffer{})
	if err == nil || strings.ContainsRune(esc(err.Error()), '\x1b') || !strings.Contains(esc(err.Error()), `\x1b[2K`) {
		t.Fatalf("warm-up error %q, escaped %q: want the escape code shown escaped", err, esc(err.Error()))
	}
}

// The filter under stdout escapes any control or format character but tab
// and newline, byte for byte the rest.
func TestSafeWriter(t *testing.T) {
	var b bytes.Buffer
	in := "ok\tcol\n\x1b[31mred\u202e\xffé\n"
	n, err := safeWriter{&b}.Write([]byte(in))
	if err != nil || n != len(in) || b.String() != "ok\tcol\n\\x1b[31mred\\u202e\\xffé\n" {
		t.Fatalf("wrote %d, %v: %q", n, err, b.String())
	}
	if esc("plain name-1.2 é") != "plain name-1.2 é" || esc("a\x1bb") != `"a\x1bb"` || esc("bad\xff") != `"bad\xff"` {
		t.Fatalf("esc: %q %q %q", esc("plain name-1.2 é"), esc("a\x1bb"), esc("bad\xff"))
	}
}

// Issue 47: `datasets ls` shows each dataset's quota ("-" for none) and
// `checkpoints ls` counts a step's parts in PARTS.
func TestListsShowQuotaAndPartCount(t *testing.T) {
	node := fakeNode(t)
	var out bytes.Buffer
	if err := run(context.Background(), []string{"--node", node, "datasets", "ls"}, &out); err != nil {
		t.Fatal(err)
	}
	lines := strings.Split(out.String(), "\n")
	if !strings.Contains(lines[0], "QUOTA") || !strings.Contains(lines[1], "2.0 GiB") || len(strings.Fields(lines[2])) < 5 || strings.Fields(lines[2])[4] != "-" {
		t.Fatalf("datasets ls:\n%s", out.String())
	}
	out.Reset()
	if err := run(context.Background(), []string{"--node", node, "checkpoints", "ls"}, &out); err != nil {
		t.Fatal(err)
	}
	lines = strings.Split(out.String(), "\n")
	head, row := strings.Fields(lines[0]), strings.Fields(lines[1])
	parts := -1
	for i, h := range head {
		if h == "PARTS" {
			parts = i
		}
	}
	// BYTES ("4.0 KiB") is two fields: count PARTS from the end.
	if parts < 0 || len(row) != len(head)+1 || row[len(row)-(len(head)-parts)] != "3" {
		t.Fatalf("checkpoints ls: PARTS should be 3:\n%s", out.String())
	}
}

// Issue 47: a node that does not answer is named as such, with its URL, not
// as a raw transport error; `health`'s help names /readyz, which it checks.
func TestUnreachableNodeIsNamed(t *testing.T) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	url := "http://" + ln.Addr().String()
	ln.Close() // nothing listens there now
	err = run(context.Background(), []string{"--node", url, "members"}, &bytes.Buffer{})
	if err == nil || !strings.HasPrefix(err.Error(), "no Stallfree node reachable at "+url+": ") {
		t.Fatalf("members against a closed port: %v", err)
	}
	if !strings.Contains(usage, "/readyz") || strings.Contains(usage, "answers /healthz") {
		t.Fatalf("health's help does not say it checks /readyz:\n%s", usage)
	}
}
