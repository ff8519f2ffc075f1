// Package listen keeps a node's accept loops alive when file descriptors run
// out, and bounds the connections each listener holds, so a flood of idle
// connections on one port cannot take the process, or its other ports, down.
package listen

import (
	"errors"
	"log/slog"
	"net"
	"sync"
	"sync/atomic"
	"syscall"
	"time"
)

// Options configure a guarded listener.
type Options struct {
	Name string // for logs: "http", "peer", "raft"
	// MaxConns bounds the connections open at once; beyond it a new
	// connection is refused at once (0: no bound).
	MaxConns int
	// Refuse, when set, tells a refused connection why before it is closed
	// (HTTP writes a 503); it must not block for long.
	Refuse func(net.Conn)
	Log    *slog.Logger
}

// Guard wraps ln. Its Accept never fails on EMFILE or ENFILE: it backs off
// (5 ms doubling to 1 s, as net/http does) and tries again, logging once per
// episode.
func Guard(ln net.Listener, opt Options) net.Listener {
	if opt.Log == nil {
		opt.Log = slog.Default()
	}
	return &guarded{Listener: ln, opt: opt}
}

type guarded struct {
	net.Listener
	opt         Options
	active      atomic.Int64
	lastRefused atomic.Int64 // unix nanos of the last refusal logged
}

// Active is how many accepted connections are open.
func Active(ln net.Listener) int {
	if g, ok := ln.(*guarded); ok {
		return int(g.active.Load())
	}
	return -1
}

func (g *guarded) Accept() (net.Conn, error) {
	var delay time.Duration
	for {
		c, err := g.Listener.Accept()
		if err != nil {
			if !fdExhausted(err) {
				return nil, err
			}
			if delay == 0 {
				delay = 5 * time.Millisecond
				g.opt.Log.Warn("out of file descriptors: accepting again after a pause", "listener", g.opt.Name, "err", err)
			} else {
				delay = min(2*delay, time.Second)
			}
			time.Sleep(delay)
			continue
		}
		if delay != 0 {
			g.opt.Log.Info("accepting again", "listener", g.opt.Name)
			delay = 0
		}
		if g.opt.MaxConns > 0 && g.active.Load() >= int64(g.opt.MaxConns) {
			g.refuse(c)
			continue
		}
		g.active.Add(1)
		return &conn{Conn: c, g: g}, nil
	}
}

func (g *guarded) refuse(c net.Conn) {
	now := time.Now().UnixNano()
	if last := g.lastRefused.Load(); now-last > int64(10*time.Second) && g.lastRefused.CompareAndSwap(last, now) {
		g.opt.Log.Warn("too many connections: refusing new ones", "listener", g.opt.Name, "max", g.opt.MaxConns,
			"remote", c.RemoteAddr().String())
	}
	if g.opt.Refuse != nil {
		c.SetWriteDeadline(time.Now().Add(100 * time.Millisecond))
		g.opt.Refuse(c)
	}
	c.Close()
}

func fdExhausted(err error) bool {
	return errors.Is(err, syscall.EMFILE) || errors.Is(err, syscall.ENFILE) || errors.Is(err, syscall.ENOBUFS) ||
		errors.Is(err, syscall.ENOMEM)
}

type conn struct {
	net.Conn
	g    *guarded
	once sync.Once
}

func (c *conn) Close() error {
	c.once.Do(func() { c.g.active.Add(-1) })
	return c.Conn.Close()
}

// Unwrap gives the accepted connection (to set socket options on it).
func (c *conn) Unwrap() net.Conn { return c.Conn }
