package client

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"io"
	"net/http"
	"net/url"
	"strconv"
	"strings"

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
	req, err := http.NewRequestWithContext(ctx, http.MethodPut,
		c.Base+"/v1/datasets/"+url.PathEscape(dataset)+"/index/"+strconv.Itoa(i), bytes.NewReader(data))
	if err != nil {
		return false, err
	}
	req.Header.Set("Content-Type", "application/octet-stream")
	setHeaders(req, false, c.Token)
	resp, err := c.HTTP.Do(req)
	if err != nil {
		return false, c.unreachable(ctx, err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(io.LimitReader(resp.Body, 1<<16))
	if resp.StatusCode >= 300 {
		var e api.Error
		if json.Unmarshal(b, &e) != nil || e.Message == "" {
			e.Message = strings.TrimSpace(string(b))
		}
		e.Status = resp.StatusCode
		return false, &e
	}
	return resp.StatusCode == http.StatusCreated, nil
}

// notWritten reports whether err is the answer for an item of a derived
// dataset nobody has written.
func notWritten(err error) bool {
	e, ok := errors.AsType[*api.Error](err)
	return ok && e.Status == http.StatusNotFound && e.Message == "not written"
}
