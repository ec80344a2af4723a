package certs

import (
	"context"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	ctrlwebhook "sigs.k8s.io/controller-runtime/pkg/webhook"
)

func hiddenDirs(t *testing.T, dir string) []string {
	t.Helper()
	entries, err := os.ReadDir(dir)
	require.NoError(t, err)
	var out []string
	for _, e := range entries {
		if e.IsDir() && strings.HasPrefix(e.Name(), "..") {
			out = append(out, e.Name())
		}
	}
	return out
}

func TestWriteAtomic(t *testing.T) {
	dir := t.TempDir()
	// A plain file left by an older version is replaced by a link.
	require.NoError(t, os.WriteFile(filepath.Join(dir, "tls.crt"), []byte("legacy"), 0o600))

	changed, err := WriteAtomic(dir, map[string][]byte{"tls.crt": []byte("cert 1"), "tls.key": []byte("key 1")})
	require.NoError(t, err)
	assert.True(t, changed)
	assert.Equal(t, "cert 1", string(must(os.ReadFile(filepath.Join(dir, "tls.crt")))))
	assert.Equal(t, "key 1", string(must(os.ReadFile(filepath.Join(dir, "tls.key")))))
	first := hiddenDirs(t, dir)
	require.Len(t, first, 1)

	changed, err = WriteAtomic(dir, map[string][]byte{"tls.crt": []byte("cert 1"), "tls.key": []byte("key 1")})
	require.NoError(t, err)
	assert.False(t, changed, "the same content writes nothing")
	assert.Equal(t, first, hiddenDirs(t, dir))

	changed, err = WriteAtomic(dir, map[string][]byte{"tls.crt": []byte("cert 2"), "tls.key": []byte("key 2")})
	require.NoError(t, err)
	assert.True(t, changed)
	assert.Equal(t, "cert 2", string(must(os.ReadFile(filepath.Join(dir, "tls.crt")))))
	assert.Equal(t, "key 2", string(must(os.ReadFile(filepath.Join(dir, "tls.key")))))
	second := hiddenDirs(t, dir)
	require.Len(t, second, 1, "the previous files are removed")
	assert.NotEqual(t, first, second)
	target, err := os.Readlink(filepath.Join(dir, dataDir))
	require.NoError(t, err)
	assert.Equal(t, second[0], target)
}

// controller-runtime's webhook server reloads a certificate folder updated
// the way the kubelet updates a Secret volume (..data swapped, old files
// removed) from its file watch, well before its 10s poll, on every rotation.
func TestWebhookServerReloadsSecretVolumeUpdates(t *testing.T) {
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	dir := t.TempDir()
	ca, _ := caAt(t, time.Now(), time.Hour)
	issue := func() KeyPair {
		kp, err := NewServing(ca, []string{"localhost"}, []net.IP{net.ParseIP("127.0.0.1")}, time.Now(), time.Hour)
		require.NoError(t, err)
		_, err = WriteAtomic(dir, map[string][]byte{KeyServingCert: kp.CertPEM, KeyServingKey: kp.KeyPEM})
		require.NoError(t, err)
		return kp
	}
	issue()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	port := l.Addr().(*net.TCPAddr).Port
	require.NoError(t, l.Close())
	srv := ctrlwebhook.NewServer(ctrlwebhook.Options{Host: "127.0.0.1", Port: port, CertDir: dir})
	go func() { _ = srv.Start(ctx) }()
	require.Eventually(t, func() bool { return srv.StartedChecker()(&http.Request{}) == nil }, 10*time.Second, 20*time.Millisecond)
	servedNow := DialServed(net.JoinHostPort("127.0.0.1", strconv.Itoa(port)), "localhost")

	var slowest time.Duration
	for range 10 {
		want := mustParse(issue())
		start := time.Now()
		require.Eventually(t, func() bool {
			got, err := servedNow(ctx)
			return err == nil && got.Equal(want)
		}, 3*time.Second, 5*time.Millisecond, "the new certificate is served within 3s (the poll is every 10s)")
		slowest = max(slowest, time.Since(start))
	}
	t.Logf("10 Secret-volume-style rotations, each served within %s", slowest.Round(time.Millisecond))
}
