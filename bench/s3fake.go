package bench

import (
	"context"
	"encoding/xml"
	"fmt"
	"net"
	"net/http"
	"strconv"
	"strings"
	"time"
)

// fakeBucket answers S3's ListObjectsV2 for a bucket holding n synthetic
// objects, many/dDDDD/oNNNNNNNN.bin in directories of perDir, without storing
// any: a manifest-sized bucket for measuring listing and registration at
// millions of keys, which a real server here would take hours to fill.
// Only listing is served; it stands in for the bucket, not for MinIO's
// listing speed.
type fakeBucket struct{ n, perDir int }

func (f *fakeBucket) key(i int) string { return fmt.Sprintf("many/d%04d/o%08d.bin", i/f.perDir, i) }

type listResult struct {
	XMLName               xml.Name       `xml:"ListBucketResult"`
	Name                  string         `xml:"Name"`
	Prefix                string         `xml:"Prefix"`
	KeyCount              int            `xml:"KeyCount"`
	MaxKeys               int            `xml:"MaxKeys"`
	IsTruncated           bool           `xml:"IsTruncated"`
	NextContinuationToken string         `xml:"NextContinuationToken,omitempty"`
	Contents              []listObject   `xml:"Contents"`
	CommonPrefixes        []commonPrefix `xml:"CommonPrefixes"`
}

type listObject struct {
	Key          string `xml:"Key"`
	LastModified string `xml:"LastModified"`
	ETag         string `xml:"ETag"`
	Size         int64  `xml:"Size"`
	StorageClass string `xml:"StorageClass"`
}

type commonPrefix struct {
	Prefix string `xml:"Prefix"`
}

func (f *fakeBucket) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	q := r.URL.Query()
	if r.Method != http.MethodGet || q.Get("list-type") != "2" {
		http.Error(w, "only ListObjectsV2", http.StatusNotImplemented)
		return
	}
	prefix, from := q.Get("prefix"), 0
	if t := q.Get("continuation-token"); t != "" {
		from, _ = strconv.Atoi(t)
	}
	res := listResult{Name: strings.Trim(r.URL.Path, "/"), Prefix: prefix, MaxKeys: 1000}
	dirs := (f.n + f.perDir - 1) / f.perDir
	switch {
	case prefix == "many/" && q.Get("delimiter") == "/": // the first level: directories
		for d := from; d < dirs && len(res.CommonPrefixes) < 1000; d++ {
			res.CommonPrefixes = append(res.CommonPrefixes, commonPrefix{fmt.Sprintf("many/d%04d/", d)})
			if d+1 < dirs && len(res.CommonPrefixes) == 1000 {
				res.IsTruncated, res.NextContinuationToken = true, strconv.Itoa(d+1)
			}
		}
	case strings.HasPrefix(prefix, "many/d"): // one directory, recursively
		d, err := strconv.Atoi(strings.TrimSuffix(strings.TrimPrefix(prefix, "many/d"), "/"))
		if err != nil {
			break
		}
		end := min((d+1)*f.perDir, f.n)
		for i := max(d*f.perDir, from); i < end && len(res.Contents) < 1000; i++ {
			res.Contents = append(res.Contents, listObject{Key: f.key(i), LastModified: "2026-11-01T00:00:00.000Z",
				ETag: fmt.Sprintf(`"%032x"`, i), Size: int64(100 + i%400), StorageClass: "STANDARD"})
			if i+1 < end && len(res.Contents) == 1000 {
				res.IsTruncated, res.NextContinuationToken = true, strconv.Itoa(i+1)
			}
		}
	}
	res.KeyCount = len(res.Contents) + len(res.CommonPrefixes)
	w.Header().Set("Content-Type", "application/xml")
	fmt.Fprint(w, xml.Header)
	xml.NewEncoder(w).Encode(res)
}

// ListResult is the registration of a manifest-sized bucket.
type ListResult struct {
	Objects int     `json:"objects"`
	Nodes   int     `json:"nodes"`
	Seconds float64 `json:"register_seconds"`
	NodeRSS uint64  `json:"node_rss_bytes"` // the larger of the two nodes, after registration
}

// S3List registers a fake bucket of objects keys on 2 nodes and times it.
func S3List(c *Config, objects int) (*ListResult, error) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return nil, err
	}
	srv := &http.Server{Handler: &fakeBucket{n: objects, perDir: 1000}, ReadHeaderTimeout: 10 * time.Second}
	go srv.Serve(ln)
	defer srv.Close()
	env := []string{"AWS_ACCESS_KEY_ID=bench", "AWS_SECRET_ACCESS_KEY=bench-secret"}
	cl, err := startCluster(c, "list", 2, "1GiB", env, "--s3-endpoint", "http://"+ln.Addr().String())
	defer cl.stop()
	if err != nil {
		return nil, err
	}
	n1, n2 := cl[0], cl[1]
	res := &ListResult{Objects: objects, Nodes: 2}
	start := time.Now()
	if err := register(n1, "many", "s3://bench/many"); err != nil {
		return nil, fmt.Errorf("registering %d objects: %w", objects, err)
	}
	res.Seconds = time.Since(start).Seconds()
	d, err := n2.c.Dataset(context.Background(), "many")
	if err != nil {
		return nil, err
	}
	if d.Items != objects {
		return nil, fmt.Errorf("registered %d items of %d", d.Items, objects)
	}
	res.NodeRSS = max(rssOf(n1.cmd.Process.Pid), rssOf(n2.cmd.Process.Pid))
	return res, nil
}
