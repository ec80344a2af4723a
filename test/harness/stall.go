package harness

import (
	"crypto/tls"
	"errors"
	"fmt"
	"io"
	"net"
	"time"
)

// StallRequest opens an HTTP/1.1 connection over TLS to addr and sends a
// JSON POST to path whose headers announce a body of 200,000 bytes, then
// only its first bytes: a client that stalls, as anyone who reaches a
// webhook's port can. The caller closes the connection.
func StallRequest(addr, path string) (*tls.Conn, error) {
	conn, err := tls.Dial("tcp", addr, &tls.Config{InsecureSkipVerify: true, NextProtos: []string{"http/1.1"}}) //nolint:gosec // only the answer is looked at
	if err != nil {
		return nil, err
	}
	if _, err := fmt.Fprintf(conn, "POST %s HTTP/1.1\r\nHost: guard\r\nContent-Type: application/json\r\nContent-Length: 200000\r\n\r\n{\"kind\":", path); err != nil {
		conn.Close()
		return nil, err
	}
	return conn, nil
}

// ReadUntilClosed reads what the server answers on conn until it closes the
// connection, and fails if it has not by deadline.
func ReadUntilClosed(conn net.Conn, deadline time.Time) (string, error) {
	if err := conn.SetReadDeadline(deadline); err != nil {
		return "", err
	}
	rest, err := io.ReadAll(conn)
	var ne net.Error
	if errors.As(err, &ne) && ne.Timeout() {
		return string(rest), fmt.Errorf("the connection is still open at %s (read %q)", deadline.Format(time.TimeOnly), rest)
	}
	return string(rest), nil
}
