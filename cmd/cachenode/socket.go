package main

import (
	"fmt"
	"io/fs"
	"log/slog"
	"net"
	"os"
	"path/filepath"

	"stallfree/listen"
)

// socketFlag is --socket (the loader fast path): the HTTP API on a Unix
// socket as well, for loaders on this host. Unset means the default path
// in the data directory; set to "" it is off.
type socketFlag struct {
	path string
	set  bool
}

const socketUsage = `serve the HTTP API on this Unix socket too, for loaders on this host (default DATA-DIR/stallfree.sock; "" = off)`

func (f *socketFlag) String() string { return f.path }
func (f *socketFlag) Set(v string) error {
	f.path, f.set = v, true
	return nil
}

// socketListener opens the --socket listener, or returns nil when it is
// off. Mode 0600 with a token keeps the socket to the node's own user (the
// token is checked on it all the same); without one, 0666 gives anyone on
// the host what the loopback TCP port gives them already. An explicit path
// that cannot be served stops the node; the default one only logs why, as
// a node must not fail to start over an optimisation nobody asked for.
func socketListener(f socketFlag, dataDir, token string, log *slog.Logger) (net.Listener, string, error) {
	path := f.path
	if !f.set {
		path = filepath.Join(dataDir, "stallfree.sock")
	}
	if path == "" {
		return nil, "", nil
	}
	mode := fs.FileMode(0o666)
	if token != "" {
		mode = 0o600
	}
	if !f.set {
		if err := os.MkdirAll(dataDir, 0o750); err != nil {
			log.Warn("no Unix socket: cannot create the data directory", "err", err)
			return nil, "", nil
		}
	}
	ln, err := listen.Unix(path, mode)
	if err != nil {
		if f.set {
			return nil, "", fmt.Errorf("--socket: %w", err)
		}
		log.Warn("no Unix socket (set --socket PATH, or --socket '' to silence this)", "err", err)
		return nil, "", nil
	}
	return ln, path, nil
}
