package httpapi

import (
	"bufio"
	"io"
	"net/url"

	"github.com/valyala/fasthttp"
)

type fastCtx = fasthttp.RequestCtx

func bufioReader(r io.Reader) *bufio.Reader { return bufio.NewReader(r) }

func urlPathEscape(s string) string { return url.PathEscape(s) }
