package catalog

import (
	"errors"
	"log/slog"
	"net"
	"sync"
	"time"

	"github.com/hashicorp/raft"

	"stallfree/clusterauth"
	"stallfree/listen"
	"stallfree/logbridge"
)

// authStream is raft's network layer with the cluster-key handshake in front
// of every connection, both ways: raft never reads a byte from a party that
// does not hold the key, so no RPC of a stranger is ever applied.
type authStream struct {
	ln    net.Listener
	adv   net.Addr
	key   []byte
	log   *slog.Logger
	conns chan net.Conn
	done  chan struct{}
	once  sync.Once
	wg    sync.WaitGroup
	// refusals keeps the line about a refused handshake to one per
	// interval: anyone who reaches the port can cause one at will.
	refusals *logbridge.Limiter
}

// maxRaftConns bounds raft's inbound connections: a handful per member.
const maxRaftConns = 256

func newAuthStream(bind string, adv net.Addr, key []byte, log *slog.Logger) (*authStream, error) {
	ln, err := net.Listen("tcp", bind)
	if err != nil {
		return nil, err
	}
	s := &authStream{ln: listen.Guard(ln, listen.Options{Name: "raft", MaxConns: maxRaftConns, Log: log}),
		adv: adv, key: key, log: log, conns: make(chan net.Conn), done: make(chan struct{}),
		refusals: logbridge.NewLimiter(logbridge.RefusalsEvery)}
	s.wg.Add(1)
	go s.acceptLoop()
	return s, nil
}

// acceptLoop authenticates each connection on a goroutine of its own, so a
// silent party cannot hold up the members behind it.
func (s *authStream) acceptLoop() {
	defer s.wg.Done()
	for {
		c, err := s.ln.Accept()
		if err != nil {
			return // closed
		}
		s.wg.Add(1)
		go func() {
			defer s.wg.Done()
			if err := clusterauth.Server(c, s.key); err != nil {
				if ok, leftOut := s.refusals.Allow(); ok {
					s.log.Warn("raft connection refused", "remote", c.RemoteAddr().String(), "err", err, "left_out", leftOut)
				}
				c.Close()
				return
			}
			select {
			case s.conns <- c:
			case <-s.done:
				c.Close()
			}
		}()
	}
}

func (s *authStream) Accept() (net.Conn, error) {
	select {
	case c := <-s.conns:
		return c, nil
	case <-s.done:
		return nil, errors.New("raft stream closed")
	}
}

func (s *authStream) Close() error {
	s.once.Do(func() {
		close(s.done)
		s.ln.Close()
	})
	s.wg.Wait()
	return nil
}

func (s *authStream) Addr() net.Addr { return s.adv }

func (s *authStream) Dial(addr raft.ServerAddress, timeout time.Duration) (net.Conn, error) {
	return clusterauth.Dial(string(addr), timeout, s.key)
}
