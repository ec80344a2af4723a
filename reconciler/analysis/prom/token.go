package prom

import (
	"bytes"
	"fmt"
	"os"
	"sync"
	"time"
)

// tokenFile is a bearer token read from a file and read again when the
// file's modification time or size changes: a Secret mount is rotated by
// swapping a symlink, which os.Stat follows to the new file.
type tokenFile struct {
	path string

	mu      sync.Mutex
	modTime time.Time
	size    int64
	token   string
}

// maxTokenBytes bounds what is read from the token file.
const maxTokenBytes = 64 << 10

// get returns the current token. The error never holds the token.
func (f *tokenFile) get() (string, error) {
	fi, err := os.Stat(f.path)
	if err != nil {
		return "", fmt.Errorf("bearer token file: %w", err)
	}
	f.mu.Lock()
	defer f.mu.Unlock()
	if f.token != "" && fi.ModTime().Equal(f.modTime) && fi.Size() == f.size {
		return f.token, nil
	}
	if fi.Size() > maxTokenBytes {
		return "", fmt.Errorf("bearer token file %s is %d bytes, over %d: point bearerTokenFile at the token alone", f.path, fi.Size(), maxTokenBytes)
	}
	b, err := os.ReadFile(f.path)
	if err != nil {
		return "", fmt.Errorf("bearer token file: %w", err)
	}
	tok := string(bytes.TrimSpace(b))
	if tok == "" {
		return "", fmt.Errorf("bearer token file %s is empty: put the token in it", f.path)
	}
	if bytes.ContainsFunc([]byte(tok), func(r rune) bool { return r < 0x20 || r == 0x7f }) {
		// Go would refuse the header; say why here, without the token.
		return "", fmt.Errorf("bearer token file %s holds control characters inside the token: write the token on one line", f.path)
	}
	f.token, f.modTime, f.size = tok, fi.ModTime(), fi.Size()
	return tok, nil
}
