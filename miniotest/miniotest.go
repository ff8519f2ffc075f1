// Package miniotest runs a real MinIO server for tests and benchmarks: the
// S3-compatible storage s3:// datasets are tested against. The binary comes from
// scripts/minio.sh (make test builds it once into a cache); its path is in
// STALLFREE_MINIO.
package miniotest

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"syscall"
	"testing"
	"time"

	"github.com/minio/minio-go/v7"
	"github.com/minio/minio-go/v7/pkg/credentials"
)

// Credentials of every test server.
const (
	User     = "stallfree-test"
	Password = "stallfree-test-secret"
)

// Server is a MinIO process on loopback.
type Server struct {
	Endpoint string // http://127.0.0.1:PORT
	Client   *minio.Client
	bin, dir string
	addr     string
	log      string
	cmd      *exec.Cmd
}

// Binary returns the MinIO server binary or fails the test: an S3 test
// that cannot run must not pass.
func Binary(t testing.TB) string {
	t.Helper()
	bin := os.Getenv("STALLFREE_MINIO")
	if bin == "" {
		t.Fatal("STALLFREE_MINIO is not set: run `make test`, or STALLFREE_MINIO=$(scripts/minio.sh) go test ...")
	}
	if _, err := os.Stat(bin); err != nil {
		t.Fatalf("STALLFREE_MINIO: %v", err)
	}
	return bin
}

// Start runs a server for a test on a free loopback port with its data in a
// temporary directory; it is stopped when the test ends.
func Start(t testing.TB) *TestServer {
	t.Helper()
	s, err := Run(Binary(t), t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(s.Stop)
	return &TestServer{Server: s, t: t}
}

// Run starts a server with its data and log in dir.
func Run(bin, dir string) (*Server, error) {
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return nil, err
	}
	addr, err := freeAddr()
	if err != nil {
		return nil, err
	}
	s := &Server{bin: bin, dir: filepath.Join(dir, "data"), addr: addr, log: filepath.Join(dir, "minio.log"), Endpoint: "http://" + addr}
	if s.Client, err = minio.New(s.addr, &minio.Options{Creds: credentials.NewStaticV4(User, Password, ""), BucketLookup: minio.BucketLookupPath}); err != nil {
		return nil, err
	}
	return s, s.Restart()
}

// Restart starts the server again on the same port and data (after Stop).
func (s *Server) Restart() error {
	console, err := freeAddr()
	if err != nil {
		return err
	}
	cmd := exec.Command(s.bin, "server", s.dir, "--address", s.addr, "--console-address", console, "--quiet")
	cmd.Env = append(os.Environ(), "MINIO_ROOT_USER="+User, "MINIO_ROOT_PASSWORD="+Password,
		"MINIO_BROWSER=off", "MINIO_UPDATE=off", "HOME="+filepath.Dir(s.dir))
	log, err := os.OpenFile(s.log, os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o644)
	if err != nil {
		return err
	}
	defer log.Close()
	cmd.Stdout, cmd.Stderr = log, log
	cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
	if err := cmd.Start(); err != nil {
		return err
	}
	s.cmd = cmd
	deadline := time.Now().Add(60 * time.Second)
	for {
		resp, err := http.Get(s.Endpoint + "/minio/health/live")
		if err == nil {
			resp.Body.Close()
			if resp.StatusCode == http.StatusOK {
				return nil
			}
		}
		if time.Now().After(deadline) {
			s.Stop()
			b, _ := os.ReadFile(s.log)
			return fmt.Errorf("MinIO did not come up on %s: %s", s.addr, b)
		}
		time.Sleep(50 * time.Millisecond)
	}
}

// PIDs is the server's process, for charging it CPU time.
func (s *Server) PIDs() []int {
	if s.cmd == nil || s.cmd.Process == nil {
		return nil
	}
	return []int{s.cmd.Process.Pid}
}

// Stop stops the server (idempotent).
func (s *Server) Stop() {
	if s.cmd == nil || s.cmd.Process == nil {
		return
	}
	s.cmd.Process.Signal(syscall.SIGTERM)
	done := make(chan struct{})
	go func() { s.cmd.Wait(); close(done) }()
	select {
	case <-done:
	case <-time.After(10 * time.Second):
		s.cmd.Process.Kill()
		<-done
	}
	s.cmd = nil
}

// Bucket creates a bucket.
func (s *Server) Bucket(name string) error {
	if err := s.Client.MakeBucket(context.Background(), name, minio.MakeBucketOptions{}); err != nil {
		return fmt.Errorf("make bucket %s: %w", name, err)
	}
	return nil
}

// Put writes objects, several at once.
func (s *Server) Put(bucket string, objects map[string][]byte) error {
	type job struct {
		key  string
		data []byte
	}
	const writers = 16
	jobs := make(chan job)
	errs := make(chan error, writers)
	for range writers {
		go func() {
			var first error
			for j := range jobs {
				_, err := s.Client.PutObject(context.Background(), bucket, j.key, bytes.NewReader(j.data), int64(len(j.data)), minio.PutObjectOptions{})
				if err != nil && first == nil {
					first = fmt.Errorf("put %s: %w", j.key, err)
				}
			}
			errs <- first
		}()
	}
	for k, b := range objects {
		jobs <- job{k, b}
	}
	close(jobs)
	var err error
	for range writers {
		err = errors.Join(err, <-errs)
	}
	return err
}

// TestServer is a Server whose failures fail the test.
type TestServer struct {
	*Server
	t testing.TB
}

// Restart restarts the server or fails the test.
func (s *TestServer) Restart() {
	s.t.Helper()
	if err := s.Server.Restart(); err != nil {
		s.t.Fatal(err)
	}
}

// Bucket creates a bucket or fails the test.
func (s *TestServer) Bucket(name string) {
	s.t.Helper()
	if err := s.Server.Bucket(name); err != nil {
		s.t.Fatal(err)
	}
}

// Put writes objects or fails the test.
func (s *TestServer) Put(bucket string, objects map[string][]byte) {
	s.t.Helper()
	if err := s.Server.Put(bucket, objects); err != nil {
		s.t.Fatal(err)
	}
}

// CredentialsEnv is the environment a node needs to read this server.
func CredentialsEnv() []string {
	return []string{"AWS_ACCESS_KEY_ID=" + User, "AWS_SECRET_ACCESS_KEY=" + Password}
}

func freeAddr() (string, error) {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return "", err
	}
	defer l.Close()
	return l.Addr().String(), nil
}

// Objects makes n objects below prefix with awkward but valid keys (spaces,
// unicode, URL metacharacters, "..dots", nested prefixes) and random bytes;
// byKey maps each key as a dataset sees it (the prefix removed) to its bytes.
func Objects(prefix string, n int) (objects, byKey map[string][]byte) {
	r := rand.New(rand.NewPCG(uint64(n), 7))
	objects, byKey = map[string][]byte{}, map[string][]byte{}
	names := []string{"with space.jpg", "ünï/cøde.jpg", "pct%25.jpg", "q?mark.jpg", "hash#.jpg", "..dots.jpg", "plus+sign.jpg"}
	for i := range n {
		key := fmt.Sprintf("n%03d/sub %d/img_%05d.jpg", i%17, i%3, i)
		if i < len(names) {
			key = names[i]
		}
		b := make([]byte, 1+r.IntN(3500))
		for j := range b {
			b[j] = byte(r.Uint32())
		}
		objects[prefix+key], byKey[key] = b, b
	}
	return objects, byKey
}
