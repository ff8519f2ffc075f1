package bench

import (
	"archive/tar"
	"context"
	"encoding/json"
	"fmt"
	"math/rand/v2"
	"os"
	"path/filepath"
	"time"
)

// TarResult compares one WebDataset held as tar shards with the same members
// as one file each, on a 2-node cluster.
type TarResult struct {
	Samples     int `json:"samples"`
	SampleBytes int `json:"sample_bytes"` // mean bytes of a sample's three members
	PerShard    int `json:"samples_per_shard"`
	// Samples/s through one node, 16 connections: one sample per request
	// (tar: samples/{i}; files: /batch of the sample's 3 keys), and 64 per
	// request (samples/batch; /batch of 192 keys).
	TarSinglePerS   float64 `json:"tar_single_samples_per_s"`
	FilesSinglePerS float64 `json:"files_single_samples_per_s"`
	TarBatchPerS    float64 `json:"tar_batch64_samples_per_s"`
	FilesBatchPerS  float64 `json:"files_batch64_samples_per_s"`
	TarWarmMBPerS   float64 `json:"tar_warmup_mb_per_s"`
	FilesWarmMBPerS float64 `json:"files_warmup_mb_per_s"`
	TarRegisterS    float64 `json:"tar_register_s"`
	FilesRegisterS  float64 `json:"files_register_s"`
}

// Tar writes samples (a .jpg of ~jpgSize bytes, a .cls and a .json each) as
// shards of perShard samples and as files, and measures registration, warm-up
// and sample fetch rates for both.
func Tar(c *Config, samples, jpgSize, perShard int, d time.Duration) (*TarResult, error) {
	res := &TarResult{Samples: samples, PerShard: perShard}
	shards, files := filepath.Join(c.Work, "wds-shards"), filepath.Join(c.Work, "wds-files")
	total, err := writeWDS(shards, files, samples, jpgSize, perShard)
	if err != nil {
		return nil, err
	}
	res.SampleBytes = int(total / int64(samples))
	cl, err := startCluster(c, "tar", 2, "4GiB", nil)
	defer cl.stop()
	if err != nil {
		return nil, err
	}
	n1 := cl[0]
	for _, ds := range []struct {
		name, src     string
		reg, warmMBps *float64
	}{{"wds", "tar+dir://" + shards, &res.TarRegisterS, &res.TarWarmMBPerS}, {"files", files, &res.FilesRegisterS, &res.FilesWarmMBPerS}} {
		start := time.Now()
		if err := register(n1, ds.name, ds.src); err != nil {
			return nil, fmt.Errorf("register %s: %w", ds.name, err)
		}
		*ds.reg = time.Since(start).Seconds()
		start = time.Now()
		if err := warm(cl, ds.name); err != nil {
			return nil, err
		}
		*ds.warmMBps = float64(total) / time.Since(start).Seconds() / 1e6
	}

	paths := make([]string, samples)
	for i := range paths {
		paths[i] = fmt.Sprintf("/v1/datasets/wds/samples/%d", i)
	}
	members := func(r *rand.Rand, n int) []string {
		var keys []string
		for range n {
			i := r.IntN(samples)
			for _, ext := range []string{"cls", "jpg", "json"} {
				keys = append(keys, fmt.Sprintf("s%07d.%s", i, ext))
			}
		}
		return keys
	}
	indices := func(r *rand.Rand, n int) []int {
		out := make([]int, n)
		for j := range out {
			out[j] = r.IntN(samples)
		}
		return out
	}
	body := func(v any) []byte { b, _ := json.Marshal(v); return b }
	for _, run := range []struct {
		t   *Target
		per int
		out *float64
	}{
		{HTTPGet("tar-sample", n1.http, n1.pids, paths, ""), 1, &res.TarSinglePerS},
		{HTTPPost("files-sample", n1.http, n1.pids, "/v1/datasets/files/batch", 3, "",
			func(r *rand.Rand) []byte { return body(map[string]any{"keys": members(r, 1)}) }), 1, &res.FilesSinglePerS},
		{HTTPPost("tar-batch64", n1.http, n1.pids, "/v1/datasets/wds/samples/batch", 64, "",
			func(r *rand.Rand) []byte { return body(map[string]any{"indices": indices(r, 64)}) }), 64, &res.TarBatchPerS},
		{HTTPPost("files-batch64", n1.http, n1.pids, "/v1/datasets/files/batch", 192, "",
			func(r *rand.Rand) []byte { return body(map[string]any{"keys": members(r, 64)}) }), 64, &res.FilesBatchPerS},
	} {
		r, err := Run(run.t, 16, d)
		if err != nil {
			return nil, fmt.Errorf("%s: %w", run.t.Name, err)
		}
		if r.Errors > 0 {
			return nil, fmt.Errorf("%s: %d errors", run.t.Name, r.Errors)
		}
		*run.out = r.ReqPerSec * float64(run.per)
	}
	// Both datasets must have served from memory: a storage read would make
	// the comparison one of disks.
	for _, n := range cl {
		s, err := n.c.Stats(context.Background())
		if err != nil {
			return nil, err
		}
		if s.Misses > 0 {
			return nil, fmt.Errorf("%s: %d misses during the sample runs", n.name, s.Misses)
		}
	}
	return res, nil
}

// writeWDS writes the same samples as tar shards under shards and as files
// (s0000000.jpg, ...) under files, and returns the member bytes.
func writeWDS(shards, files string, samples, jpgSize, perShard int) (int64, error) {
	for _, d := range []string{shards, files} {
		os.RemoveAll(d)
		if err := os.MkdirAll(d, 0o755); err != nil {
			return 0, err
		}
	}
	r := rand.New(rand.NewPCG(7, 7))
	var total int64
	var tw *tar.Writer
	var f *os.File
	closeShard := func() error {
		if tw == nil {
			return nil
		}
		if err := tw.Close(); err != nil {
			return err
		}
		return f.Close()
	}
	for i := range samples {
		if i%perShard == 0 {
			if err := closeShard(); err != nil {
				return 0, err
			}
			var err error
			if f, err = os.Create(filepath.Join(shards, fmt.Sprintf("train-%06d.tar", i/perShard))); err != nil {
				return 0, err
			}
			tw = tar.NewWriter(f)
		}
		jpg := make([]byte, jpgSize/2+r.IntN(jpgSize))
		for j := range jpg {
			jpg[j] = byte(r.Uint32())
		}
		for _, m := range []struct {
			ext string
			b   []byte
		}{{"jpg", jpg}, {"cls", fmt.Appendf(nil, "%d", i%1000)}, {"json", fmt.Appendf(nil, `{"i":%d}`, i)}} {
			name := fmt.Sprintf("s%07d.%s", i, m.ext)
			if err := tw.WriteHeader(&tar.Header{Name: name, Mode: 0o644, Size: int64(len(m.b)), Typeflag: tar.TypeReg}); err != nil {
				return 0, err
			}
			if _, err := tw.Write(m.b); err != nil {
				return 0, err
			}
			if err := os.WriteFile(filepath.Join(files, name), m.b, 0o644); err != nil {
				return 0, err
			}
			total += int64(len(m.b))
		}
	}
	return total, closeShard()
}
