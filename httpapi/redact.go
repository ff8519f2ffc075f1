package httpapi

import (
	"bytes"
	"fmt"
	"log/slog"
	"regexp"
)

// Secrets never reach a log or an error body. fasthttp quotes the start of a
// request it cannot parse (the request line and headers, bearer token
// included) in its errors; the API's error bodies and fasthttp's own log
// lines pass through redact first.

// authHeader matches an Authorization header's value up to the end of its
// line, however fasthttp quoted or escaped the line breaks.
var authHeader = regexp.MustCompile(`(?i)(authorization\s*:\s*)([^\r\n\\"]*)`)

type redactor struct{ token []byte }

func (r redactor) redact(s string) string {
	if len(r.token) > 0 {
		s = string(bytes.ReplaceAll([]byte(s), r.token, []byte("[redacted]")))
	}
	return authHeader.ReplaceAllString(s, "${1}[redacted]")
}

// fasthttpLogger is fasthttp's Logger, redacted, at debug level.
type fasthttpLogger struct {
	r   redactor
	log *slog.Logger
}

func (l fasthttpLogger) Printf(format string, args ...any) {
	l.log.Debug(l.r.redact(fmt.Sprintf(format, args...)), "component", "fasthttp")
}
