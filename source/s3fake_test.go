package source

import (
	"bufio"
	"crypto/md5"
	"encoding/hex"
	"encoding/xml"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"net/url"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"
)

// fakeS3 is an in-process S3 endpoint with just what the S3 reader and
// Upload use: make a bucket, put (plain or aws-chunked bodies), delete, get
// (whole or a byte range) and ListObjectsV2 (prefix, delimiter, pages). It
// lets the reader's own logic be tested in milliseconds; the integration tier
// (build tag minio) runs the same tests against a real MinIO server, which is
// what proves the reader speaks S3.
//
// It checks no signatures: an access key it does not know is refused as S3
// refuses one, which is what the reader's error mapping sees.
type fakeS3 struct {
	t        testing.TB
	srv      *httptest.Server
	Endpoint string
	user     string // the only access key it accepts
	page     int    // keys per listing page: small, so pagination runs
	down     atomic.Bool
	gets     atomic.Int64
	region   atomic.Value // the region of the last request's credential scope
	// rangeAnswer, when set, is how a ranged GET is answered: "whole" (200
	// and the whole object, as RFC 9110 allows) or "shifted" (206 with the
	// range one byte on).
	rangeAnswer atomic.Value
	// repeatPage makes every listing page the first, truncated, with the
	// same continuation token: a listing without end.
	repeatPage atomic.Bool
	// stallAfter > 0 makes a whole object's GET send that many bytes, then
	// nothing until the client gives up.
	stallAfter atomic.Int64
	// wholeExtra bytes are added to a whole object's GET, its ETag kept:
	// a body of another length than listed.
	wholeExtra atomic.Int64
	// trickle sends a whole object's GET in pieces of 256 bytes this far
	// apart.
	trickle atomic.Int64 // a time.Duration

	mu      sync.Mutex
	buckets map[string]map[string]fakeObject
}

type fakeObject struct {
	data []byte
	etag string
}

func startFakeS3(t testing.TB, user string) *fakeS3 {
	f := &fakeS3{t: t, user: user, page: 10, buckets: map[string]map[string]fakeObject{}}
	f.srv = httptest.NewServer(f)
	f.Endpoint = f.srv.URL
	t.Cleanup(f.srv.Close)
	return f
}

func (f *fakeS3) url() string         { return f.Endpoint }
func (f *fakeS3) checksSecrets() bool { return false }
func (f *fakeS3) outage() time.Duration {
	return 300 * time.Millisecond // a 503 answers at once; only the retries take time
}

// Stop makes every request fail as an overloaded server does (503), until
// Restart.
func (f *fakeS3) Stop()    { f.down.Store(true) }
func (f *fakeS3) Restart() { f.down.Store(false) }

func (f *fakeS3) Bucket(name string) {
	f.mu.Lock()
	defer f.mu.Unlock()
	if f.buckets[name] == nil {
		f.buckets[name] = map[string]fakeObject{}
	}
}

func (f *fakeS3) Put(bucket string, objects map[string][]byte) {
	f.mu.Lock()
	defer f.mu.Unlock()
	for k, b := range objects {
		f.buckets[bucket][k] = newFakeObject(b)
	}
}

func (f *fakeS3) Remove(bucket, key string) {
	f.mu.Lock()
	defer f.mu.Unlock()
	delete(f.buckets[bucket], key)
}

func newFakeObject(b []byte) fakeObject {
	sum := md5.Sum(b)
	return fakeObject{data: slices.Clone(b), etag: `"` + hex.EncodeToString(sum[:]) + `"`}
}

func (f *fakeS3) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	if f.down.Load() {
		f.fail(w, http.StatusServiceUnavailable, "SlowDown", "the fake is down")
		return
	}
	if !strings.Contains(r.Header.Get("Authorization"), "Credential="+f.user+"/") {
		f.fail(w, http.StatusForbidden, "InvalidAccessKeyId", "unknown access key")
		return
	}
	if _, scope, ok := strings.Cut(r.Header.Get("Authorization"), "Credential="+f.user+"/"); ok {
		if parts := strings.Split(scope, "/"); len(parts) > 2 {
			f.region.Store(parts[1]) // DATE/REGION/s3/aws4_request
		}
	}
	bucket, key, _ := strings.Cut(strings.TrimPrefix(r.URL.Path, "/"), "/")
	f.mu.Lock()
	objs, ok := f.buckets[bucket]
	f.mu.Unlock()
	if r.Method == http.MethodPut && key == "" {
		f.Bucket(bucket)
		return
	}
	if !ok {
		f.fail(w, http.StatusNotFound, "NoSuchBucket", "no bucket "+bucket)
		return
	}
	switch {
	case r.Method == http.MethodGet && key == "" && r.URL.Query().Has("location"):
		io.WriteString(w, `<?xml version="1.0" encoding="UTF-8"?><LocationConstraint xmlns="http://s3.amazonaws.com/doc/2006-03-01/"></LocationConstraint>`)
	case r.Method == http.MethodGet && key == "":
		f.list(w, r.URL.Query(), objs)
	case r.Method == http.MethodPut:
		body, err := readS3Body(r)
		if err != nil {
			f.fail(w, http.StatusBadRequest, "IncompleteBody", err.Error())
			return
		}
		o := newFakeObject(body)
		f.mu.Lock()
		objs[key] = o
		f.mu.Unlock()
		w.Header().Set("ETag", o.etag)
	case r.Method == http.MethodDelete:
		f.Remove(bucket, key)
		w.WriteHeader(http.StatusNoContent)
	case r.Method == http.MethodGet || r.Method == http.MethodHead:
		f.mu.Lock()
		o, ok := objs[key]
		f.mu.Unlock()
		if !ok {
			f.fail(w, http.StatusNotFound, "NoSuchKey", "no key "+key)
			return
		}
		f.gets.Add(1)
		f.get(w, r, o)
	default:
		f.fail(w, http.StatusNotImplemented, "NotImplemented", r.Method+" "+r.URL.String())
	}
}

func (f *fakeS3) get(w http.ResponseWriter, r *http.Request, o fakeObject) {
	h := w.Header()
	h.Set("ETag", o.etag)
	h.Set("Last-Modified", time.Unix(0, 0).UTC().Format(http.TimeFormat))
	h.Set("Content-Type", "application/octet-stream")
	data, status := o.data, http.StatusOK
	if rg := r.Header.Get("Range"); rg != "" {
		first, last, ok := parseRange(rg, int64(len(o.data)))
		if !ok {
			f.fail(w, http.StatusRequestedRangeNotSatisfiable, "InvalidRange", rg)
			return
		}
		mode, _ := f.rangeAnswer.Load().(string)
		if mode == "shifted" && last+1 < int64(len(o.data)) {
			first, last = first+1, last+1
		}
		data, status = o.data[first:last+1], http.StatusPartialContent
		h.Set("Content-Range", fmt.Sprintf("bytes %d-%d/%d", first, last, len(o.data)))
		if mode == "whole" {
			data, status = o.data, http.StatusOK
			h.Del("Content-Range")
		}
	}
	if n := f.wholeExtra.Load(); n > 0 && status == http.StatusOK {
		data = append(slices.Clip(data), make([]byte, n)...)
	}
	h.Set("Content-Length", strconv.Itoa(len(data)))
	w.WriteHeader(status)
	if gap := time.Duration(f.trickle.Load()); gap > 0 && status == http.StatusOK && r.Method == http.MethodGet {
		for off := 0; off < len(data); off += 256 {
			w.Write(data[off:min(off+256, len(data))])
			w.(http.Flusher).Flush()
			time.Sleep(gap)
		}
		return
	}
	if n := f.stallAfter.Load(); n > 0 && status == http.StatusOK && r.Method == http.MethodGet {
		w.Write(data[:min(int(n), len(data))])
		w.(http.Flusher).Flush()
		<-r.Context().Done()
		return
	}
	if r.Method == http.MethodGet {
		w.Write(data)
	}
}

// parseRange reads "bytes=FIRST-LAST" (the only form the reader sends).
func parseRange(rg string, size int64) (first, last int64, ok bool) {
	a, b, found := strings.Cut(strings.TrimPrefix(rg, "bytes="), "-")
	first, err1 := strconv.ParseInt(a, 10, 64)
	last, err2 := strconv.ParseInt(b, 10, 64)
	if !found || err1 != nil || err2 != nil || first < 0 || first > last || first >= size {
		return 0, 0, false
	}
	return first, min(last, size-1), true
}

type fakeListing struct {
	XMLName               xml.Name `xml:"ListBucketResult"`
	Name, Prefix          string
	Delimiter             string `xml:",omitempty"`
	EncodingType          string
	KeyCount, MaxKeys     int
	IsTruncated           bool
	ContinuationToken     string `xml:",omitempty"`
	NextContinuationToken string `xml:",omitempty"`
	Contents              []fakeListed
	CommonPrefixes        []struct{ Prefix string }
}

type fakeListed struct {
	Key, ETag, LastModified string
	Size                    int64
}

// list is ListObjectsV2 with keys URL-encoded (the client asks for it), a
// page of f.page keys or common prefixes at a time.
func (f *fakeS3) list(w http.ResponseWriter, q url.Values, objs map[string]fakeObject) {
	prefix, delim := q.Get("prefix"), q.Get("delimiter")
	f.mu.Lock()
	defer f.mu.Unlock()
	var keys []string
	common := map[string]bool{} // keys rolled up into a common prefix
	for k := range objs {
		if !strings.HasPrefix(k, prefix) {
			continue
		}
		if i := strings.Index(k[len(prefix):], delim); delim != "" && i >= 0 {
			k = k[:len(prefix)+i+len(delim)]
			if common[k] {
				continue
			}
			common[k] = true
		}
		keys = append(keys, k)
	}
	slices.Sort(keys)
	after := q.Get("continuation-token")
	if f.repeatPage.Load() {
		after = ""
	}
	start, _ := slices.BinarySearch(keys, after)
	if after != "" && start < len(keys) && keys[start] == after {
		start++
	}
	end := min(start+f.page, len(keys))
	res := fakeListing{Name: "bucket", Prefix: url.QueryEscape(prefix), Delimiter: delim, EncodingType: "url",
		MaxKeys: f.page, KeyCount: end - start, IsTruncated: end < len(keys), ContinuationToken: after}
	if res.IsTruncated {
		res.NextContinuationToken = keys[end-1]
	}
	if f.repeatPage.Load() {
		res.IsTruncated, res.NextContinuationToken = true, "same"
	}
	for _, k := range keys[start:end] {
		if common[k] {
			res.CommonPrefixes = append(res.CommonPrefixes, struct{ Prefix string }{url.QueryEscape(k)})
			continue
		}
		o := objs[k]
		res.Contents = append(res.Contents, fakeListed{Key: url.QueryEscape(k), ETag: o.etag, Size: int64(len(o.data)),
			LastModified: time.Unix(0, 0).UTC().Format(time.RFC3339)})
	}
	w.Header().Set("Content-Type", "application/xml")
	io.WriteString(w, xml.Header)
	if err := xml.NewEncoder(w).Encode(res); err != nil {
		f.t.Errorf("fake S3: listing: %v", err)
	}
}

func (f *fakeS3) fail(w http.ResponseWriter, status int, code, msg string) {
	w.Header().Set("Content-Type", "application/xml")
	w.WriteHeader(status)
	fmt.Fprintf(w, `<?xml version="1.0" encoding="UTF-8"?><Error><Code>%s</Code><Message>%s</Message></Error>`, code, msg)
}

// readS3Body reads a PUT body, decoding aws-chunked framing (minio-go signs
// each chunk when it talks plain http): "SIZE-HEX[;ext]\r\nDATA\r\n" until a
// chunk of 0, then optional trailers.
func readS3Body(r *http.Request) ([]byte, error) {
	if !strings.HasPrefix(r.Header.Get("X-Amz-Content-Sha256"), "STREAMING-") {
		return io.ReadAll(r.Body)
	}
	br := bufio.NewReader(r.Body)
	var out []byte
	for {
		line, err := br.ReadString('\n')
		if err != nil {
			return nil, fmt.Errorf("chunk header: %w", err)
		}
		sizeHex, _, _ := strings.Cut(strings.TrimSpace(line), ";")
		n, err := strconv.ParseInt(sizeHex, 16, 64)
		if err != nil || n < 0 {
			return nil, fmt.Errorf("chunk size %q", sizeHex)
		}
		if n == 0 {
			return out, nil
		}
		chunk := make([]byte, n+2) // the data and its CRLF
		if _, err := io.ReadFull(br, chunk); err != nil {
			return nil, fmt.Errorf("chunk: %w", err)
		}
		out = append(out, chunk[:n]...)
	}
}
