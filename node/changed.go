package node

import (
	"errors"
	"net/http"

	"stallfree/api"
	"stallfree/catalog"
	"stallfree/source"
)

// changedError is a source item that is no longer what was registered
// (its size or mtime, S3: its ETag, differ from the manifest's). It answers
// 409 {"error": "source changed: KEY"} (the contract's exact body, carried as
// an *api.Error, which httpapi passes on as it is) and still matches
// source.ErrChanged for callers that test for it.
type changedError struct {
	api *api.Error
	err error
}

func (e changedError) Error() string   { return e.api.Message + " (" + e.err.Error() + ")" }
func (e changedError) Unwrap() []error { return []error{e.api, e.err} }

// sourceChanged turns a source read of d's item index that found the item
// changed into the error the API answers; other errors pass unchanged.
func sourceChanged(d *catalog.Dataset, index int, err error) error {
	if err == nil || !errors.Is(err, source.ErrChanged) {
		return err
	}
	key := d.Manifest.Key(index)
	// The body is the contract's, word for word; cachectl adds the way out
	// (datasets refresh).
	return changedError{api: &api.Error{Status: http.StatusConflict, Message: "source changed: " + key}, err: err}
}
