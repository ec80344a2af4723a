package harness

import (
	"testing"

	"github.com/stretchr/testify/assert"
	"k8s.io/apimachinery/pkg/util/validation"
)

// The namespaces and work folders named after tests are valid names for
// every test name, subtests and table cases included.
func TestDNSLabelOfTestNames(t *testing.T) {
	for _, tc := range []struct {
		name, in, want string
	}{
		{name: "a top-level test", in: "TestPaused", want: "testpaused"},
		{name: "a subtest", in: "TestFailFast/ImagePullBackOff", want: "testfailfast-imagepu"},
		{name: "a table case with spaces", in: "TestStages/crash loop/2", want: "teststages-crash-loo"},
		{name: "cut just after a hyphen", in: "TestAbcdefghijklmno/x", want: "testabcdefghijklmno"},
		{name: "nothing usable", in: "___", want: "test"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			got := dnsLabel(tc.in, 20)
			assert.Equal(t, tc.want, got)
			// The API server appends 5 characters to a GenerateName.
			assert.Empty(t, validation.IsDNS1123Label(got+"-abcde"))
		})
	}
}
