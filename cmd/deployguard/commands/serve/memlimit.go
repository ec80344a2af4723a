package serve

import (
	"fmt"
	"strconv"
	"strings"
)

// memoryLimitEnv carries the container's memory limit in bytes (config/manager
// sets it from limits.memory with the downward API).
const memoryLimitEnv = "DEPLOYGUARD_MEMORY_LIMIT"

// softMemoryLimit returns the Go runtime's soft memory limit for a container
// limit given in bytes: 90% of it, so that the memory the runtime does not
// count (stacks, the runtime's own, what the kernel has not taken back yet)
// fits under the limit, and the heap is collected harder before the kernel
// kills the process. An explicit GOMEMLIMIT wins: ok is false then, and when
// no limit is given.
func softMemoryLimit(containerLimit string, gomemlimitSet bool) (int64, bool, error) {
	containerLimit = strings.TrimSpace(containerLimit)
	if gomemlimitSet || containerLimit == "" {
		return 0, false, nil
	}
	v, err := strconv.ParseInt(containerLimit, 10, 64)
	if err != nil || v <= 0 {
		return 0, false, fmt.Errorf("%s=%q is not a number of bytes", memoryLimitEnv, containerLimit)
	}
	return v / 10 * 9, true, nil
}
