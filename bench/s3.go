package bench

import (
	"context"
	"fmt"
	"io"
	"math/rand/v2"
	"os"
	"path/filepath"
	"sync"
	"sync/atomic"
	"time"

	"github.com/minio/minio-go/v7"

	"stallfree/miniotest"
	"stallfree/stall"
)

// S3Result is Stallfree over a real MinIO server on this machine.
type S3Result struct {
	Objects     int `json:"objects"`
	ObjectBytes int `json:"object_bytes"`
	Nodes       int `json:"nodes"`
	Concurrency int `json:"concurrency"`
	// A plain loop of GETs at the warm-up's concurrency: what the server gives.
	LoopItemsPerSec float64 `json:"get_loop_items_per_s"`
	LoopMBPerSec    float64 `json:"get_loop_mb_per_s"`
	WarmItemsPerSec float64 `json:"warmup_items_per_s"`
	WarmMBPerSec    float64 `json:"warmup_mb_per_s"`
	WarmVsLoop      float64 `json:"warmup_vs_get_loop"`
	// A random-order epoch through one node with 16 loader workers, on a
	// dataset nothing of which is cached, then on the warmed one.
	ColdEpochItemsPerSec float64 `json:"cold_epoch_items_per_s"`
	WarmEpochItemsPerSec float64 `json:"warm_epoch_items_per_s"`
	// CPU per object during the warm-up: both nodes together, and MinIO.
	WarmNodeCPUus   float64 `json:"warmup_node_cpu_us_per_item"`
	WarmMinIOCPUus  float64 `json:"warmup_minio_cpu_us_per_item"`
	LoopMinIOCPUus  float64 `json:"get_loop_minio_cpu_us_per_item"`
	LoopClientCPUus float64 `json:"get_loop_client_cpu_us_per_item"`
	// Registration (listing, manifest, raft) of a prefix of many small objects.
	ListObjects     int     `json:"list_objects"`
	RegisterSeconds float64 `json:"register_s"`
}

// S3 measures warm-up from MinIO against a plain parallel GET loop, a cold
// and a warm epoch, and the registration of listObjects objects.
func S3(c *Config, minioBin string, objects, size, listObjects int) (*S3Result, error) {
	const nodes, perNode = 2, 8 // node/warmup.go's warmConcurrency
	res := &S3Result{Objects: objects, ObjectBytes: size, Nodes: nodes, Concurrency: nodes * perNode, ListObjects: listObjects}
	os.RemoveAll(filepath.Join(c.Work, "minio")) // every run starts with an empty server
	srv, err := miniotest.Run(minioBin, filepath.Join(c.Work, "minio"))
	if err != nil {
		return nil, err
	}
	defer srv.Stop()
	if err := srv.Bucket("bench"); err != nil {
		return nil, err
	}
	c.logf("s3: uploading %d objects of %d bytes and %d small ones to MinIO", objects, size, listObjects)
	data := map[string][]byte{}
	for i := range objects {
		b := make([]byte, size)
		for j := range b {
			b[j] = byte(i*31 + j)
		}
		data[fmt.Sprintf("train/c%02d/i%07d.bin", i%16, i)] = b
	}
	if err := srv.Put("bench", data); err != nil {
		return nil, err
	}
	small := map[string][]byte{}
	for i := range listObjects {
		small[fmt.Sprintf("many/d%03d/k%07d", i%500, i)] = []byte{byte(i)}
	}
	if err := srv.Put("bench", small); err != nil {
		return nil, err
	}

	// The ceiling: every object GET once, at the warm-up's concurrency.
	keys := make(chan string, len(data))
	for k := range data {
		keys <- k
	}
	close(keys)
	var got atomic.Int64
	var wg sync.WaitGroup
	var loopErr atomic.Value
	loop0, self0 := cpuTicks(srv.PIDs()), cpuTicks([]int{os.Getpid()})
	start := time.Now()
	for range res.Concurrency {
		wg.Go(func() {
			for k := range keys {
				obj, err := srv.Client.GetObject(context.Background(), "bench", k, minio.GetObjectOptions{})
				if err == nil {
					var n int64
					n, err = drain(obj)
					got.Add(n)
				}
				if err != nil {
					loopErr.Store(err)
				}
			}
		})
	}
	wg.Wait()
	if err, ok := loopErr.Load().(error); ok {
		return nil, fmt.Errorf("GET loop: %w", err)
	}
	el := time.Since(start).Seconds()
	res.LoopMinIOCPUus = float64(cpuTicks(srv.PIDs())-loop0) / clkTck * 1e6 / float64(objects)
	res.LoopClientCPUus = float64(cpuTicks([]int{os.Getpid()})-self0) / clkTck * 1e6 / float64(objects)
	res.LoopItemsPerSec, res.LoopMBPerSec = float64(objects)/el, float64(got.Load())/el/1e6

	env := []string{"AWS_ACCESS_KEY_ID=" + miniotest.User, "AWS_SECRET_ACCESS_KEY=" + miniotest.Password}
	cl, err := startCluster(c, "s3", nodes, "4GiB", env, "--s3-endpoint", srv.Endpoint)
	defer cl.stop()
	if err != nil {
		return nil, err
	}
	n1 := cl[0]
	if err := register(n1, "s3", "s3://bench/train"); err != nil {
		return nil, err
	}
	cpu0 := cpuTicks(cl.pids())
	minio0 := cpuTicks(srv.PIDs())
	start = time.Now()
	if err := warm(cl, "s3"); err != nil {
		return nil, err
	}
	el = time.Since(start).Seconds()
	res.WarmNodeCPUus = float64(cpuTicks(cl.pids())-cpu0) / clkTck * 1e6 / float64(objects)
	res.WarmMinIOCPUus = float64(cpuTicks(srv.PIDs())-minio0) / clkTck * 1e6 / float64(objects)
	res.WarmItemsPerSec, res.WarmMBPerSec = float64(objects)/el, float64(objects*size)/el/1e6
	res.WarmVsLoop = res.WarmItemsPerSec / res.LoopItemsPerSec

	ctx := context.Background()
	order := rand.New(rand.NewPCG(1, 2)).Perm(objects)
	if err := register(n1, "s3-cold", "s3://bench/train"); err != nil {
		return nil, err
	}
	for _, run := range []struct {
		ds  string
		out *float64
	}{{"s3-cold", &res.ColdEpochItemsPerSec}, {"s3", &res.WarmEpochItemsPerSec}} {
		rd, err := stall.Read(ctx, n1.c, run.ds, order, stall.ReadOptions{Workers: 16})
		if err != nil {
			return nil, fmt.Errorf("epoch of %s: %w", run.ds, err)
		}
		*run.out = float64(objects) / rd.Elapsed.Seconds()
	}

	start = time.Now()
	if _, err := n1.c.PutDataset(ctx, "s3-many", "s3://bench/many"); err != nil {
		return nil, fmt.Errorf("registering %d objects: %w", listObjects, err)
	}
	res.RegisterSeconds = time.Since(start).Seconds()
	return res, nil
}

func drain(obj *minio.Object) (int64, error) {
	defer obj.Close()
	return io.Copy(io.Discard, obj)
}
