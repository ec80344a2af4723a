package load

import (
	"os"
	"path/filepath"

	"github.com/deployguard/deployguard/test/harness"
)

// Prepare is a bench's start: the control plane's folder (tools, or
// harness.ToolsDir's when empty), its work folder, made absolute and created,
// and the log bench.log in it, which the caller closes.
func Prepare(tools, workDir string) (toolsDir, work string, log *os.File, err error) {
	if tools == "" {
		if tools, err = harness.ToolsDir(); err != nil {
			return "", "", nil, err
		}
	}
	if work, err = filepath.Abs(workDir); err != nil {
		return "", "", nil, err
	}
	if err := os.MkdirAll(work, 0o755); err != nil {
		return "", "", nil, err
	}
	if log, err = os.Create(filepath.Join(work, "bench.log")); err != nil {
		return "", "", nil, err
	}
	return tools, work, log, nil
}
