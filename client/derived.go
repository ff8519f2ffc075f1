package client

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"slices"
	"strconv"
	"strings"

	"github.com/vmihailenco/msgpack/v5"

	"stallfree/api"
)

// Derive creates (idempotently) dataset name derived from parent with stage:
// a prep cache whose items loaders write (docs/api.md, "Prep cache").
func (c *Client) Derive(ctx context.Context, name, parent, stage string) (Dataset, error) {
	var d Dataset
	err := c.JSON(ctx, http.MethodPut, "/v1/datasets/"+url.PathEscape(name), api.PutDataset{DerivedFrom: parent, Stage: stage}, &d)
	return d, err
}

// PutItem writes item i of a derived dataset. created is true for the first
// write (201), false when the same bytes were there (200); other bytes are an
// *Error with status 409.
func (c *Client) PutItem(ctx context.Context, dataset string, i int, data []byte) (created bool, err error) {
	status, _, err := c.put(ctx, "/v1/datasets/"+url.PathEscape(dataset)+"/index/"+strconv.Itoa(i), "application/octet-stream", data, 1<<16)
	return status == http.StatusCreated, err
}

// PutItems writes several items of a derived dataset in one request (PUT
// /v1/datasets/{name}/batch), each at its owner, and returns what became of
// each, in order. An error means none was written (a bad batch) or no
// answer came.
func (c *Client) PutItems(ctx context.Context, dataset string, items []api.ItemWrite) ([]api.WriteResult, error) {
	if slices.ContainsFunc(items, func(it api.ItemWrite) bool { return it.Data == nil }) {
		// A nil []byte is msgpack's nil, which the node refuses as no data:
		// an empty item is sent as empty bytes.
		items = slices.Clone(items)
		for i := range items {
			if items[i].Data == nil {
				items[i].Data = []byte{}
			}
		}
	}
	body, err := msgpack.Marshal(items)
	if err != nil {
		return nil, err
	}
	_, b, err := c.put(ctx, "/v1/datasets/"+url.PathEscape(dataset)+"/batch", "application/msgpack", body, 64<<20)
	if err != nil {
		return nil, err
	}
	var results []api.WriteResult
	if err := json.Unmarshal(b, &results); err != nil || len(results) != len(items) {
		return nil, fmt.Errorf("batch write to %s: %d results for %d items (%v)", dataset, len(results), len(items), err)
	}
	return results, nil
}

// put sends body to path and returns the status and up to limit bytes of
// the answer; a status of 300 or more is an *Error.
func (c *Client) put(ctx context.Context, path, contentType string, body []byte, limit int64) (int, []byte, error) {
	req, err := http.NewRequestWithContext(ctx, http.MethodPut, c.Base+path, bytes.NewReader(body))
	if err != nil {
		return 0, nil, err
	}
	req.Header.Set("Content-Type", contentType)
	setHeaders(req, false, c.Token)
	resp, err := c.HTTP.Do(req)
	if err != nil {
		return 0, nil, c.unreachable(ctx, err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(io.LimitReader(resp.Body, limit))
	if resp.StatusCode >= 300 {
		var e api.Error
		if json.Unmarshal(b, &e) != nil || e.Message == "" {
			e.Message = strings.TrimSpace(string(b))
		}
		e.Status = resp.StatusCode
		return resp.StatusCode, b, &e
	}
	return resp.StatusCode, b, nil
}

// notWritten reports whether err is the answer for an item of a derived
// dataset nobody has written.
func notWritten(err error) bool {
	e, ok := errors.AsType[*api.Error](err)
	return ok && e.Status == http.StatusNotFound && e.Message == "not written"
}
