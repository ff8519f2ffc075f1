package client

import (
	"context"
	"net/http"
	"net/url"

	"stallfree/api"
)

// Checkpoints lists every checkpoint with its committed steps.
func (c *Client) Checkpoints(ctx context.Context) ([]api.Checkpoint, error) {
	var out []api.Checkpoint
	err := c.JSON(ctx, http.MethodGet, "/v1/checkpoints", nil, &out)
	return out, err
}

// Checkpoint describes one checkpoint's committed steps.
func (c *Client) Checkpoint(ctx context.Context, name string) (api.Checkpoint, error) {
	var out api.Checkpoint
	err := c.JSON(ctx, http.MethodGet, "/v1/checkpoints/"+url.PathEscape(name), nil, &out)
	return out, err
}

// DeleteCheckpoint drops a checkpoint and all its steps.
func (c *Client) DeleteCheckpoint(ctx context.Context, name string) error {
	return c.JSON(ctx, http.MethodDelete, "/v1/checkpoints/"+url.PathEscape(name), nil, nil)
}
