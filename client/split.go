package client

import (
	"context"
	"net/http"
	"net/url"

	"stallfree/api"
)

// SetQuota sets an existing dataset's cache quota in bytes (cluster-wide).
func (c *Client) SetQuota(ctx context.Context, name string, quota int64) (Dataset, error) {
	var d Dataset
	err := c.JSON(ctx, http.MethodPut, "/v1/datasets/"+url.PathEscape(name), api.PutDataset{Quota: api.QuotaOf(quota)}, &d)
	return d, err
}

// LiftQuota removes a dataset's cache quota.
func (c *Client) LiftQuota(ctx context.Context, name string) (Dataset, error) {
	var d Dataset
	err := c.JSON(ctx, http.MethodPut, "/v1/datasets/"+url.PathEscape(name), api.PutDataset{Quota: api.NoQuota()}, &d)
	return d, err
}

// Plan is GET /v1/plan: the memory split the jobs' reports suggest.
func (c *Client) Plan(ctx context.Context) (api.Plan, error) {
	var p api.Plan
	err := c.JSON(ctx, http.MethodGet, "/v1/plan", nil, &p)
	return p, err
}

// ApplyPlan is POST /v1/plan/apply: plans and sets the quotas of the split.
func (c *Client) ApplyPlan(ctx context.Context) (api.Plan, error) {
	var p api.Plan
	err := c.JSON(ctx, http.MethodPost, "/v1/plan/apply", nil, &p)
	return p, err
}
