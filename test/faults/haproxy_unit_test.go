package faults

import (
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

func TestParseStats(t *testing.T) {
	const head = "# pxname,svname,qcur,qmax,scur,smax,slim,stot,bin,bout,dreq,dresp,ereq,econ,eresp,wretr,wredis,status,\n"
	for _, tc := range []struct {
		name, body string
		want       map[string]serverState
		err        string
	}{
		{
			name: "servers of the backend only",
			body: head +
				"webhooks,FRONTEND,,,3,5,4000,120,1,2,0,0,0,,,,,OPEN,\n" +
				"guards,guard0,0,0,2,4,,57,1,2,,0,,0,0,0,0,UP,\n" +
				"guards,guard1,0,0,0,0,,0,0,0,,0,,0,0,0,0,DOWN,\n" +
				"guards,guard2,0,0,1,1,,3,0,0,,0,,0,0,0,0,UP 1/2,\n" +
				"guards,BACKEND,0,0,3,5,,60,1,2,0,0,,0,0,0,0,UP,\n",
			want: map[string]serverState{
				"guard0": {Status: "UP", Sessions: 57, Current: 2},
				"guard1": {Status: "DOWN"},
				"guard2": {Status: "UP 1/2", Sessions: 3, Current: 1},
			},
		},
		{name: "empty", body: "", err: "empty"},
		{name: "no status column", body: "# pxname,svname,scur,stot,\nguards,guard0,0,0,\n", err: "no status column"},
		{name: "not a number", body: head + "guards,guard0,0,0,x,0,,0,0,0,,0,,0,0,0,0,UP,\n", err: "scur of guard0"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			got, err := parseStats(tc.body, "guards")
			if tc.err != "" {
				require.Error(t, err)
				assert.Contains(t, err.Error(), tc.err)
				return
			}
			require.NoError(t, err)
			assert.Equal(t, tc.want, got)
		})
	}
}

func TestHAProxyConfig(t *testing.T) {
	cfg := haproxyConfig(9443, 9000, []slot{{"guard0", 10001, 10002}, {"guard1", 10003, 10004}})
	for _, want := range []string{
		"mode tcp", "bind 127.0.0.1:9443", "option httpchk GET /readyz", "option redispatch",
		"server guard0 127.0.0.1:10001 check port 10002", "server guard1 127.0.0.1:10003 check port 10004",
		"bind 127.0.0.1:9000", "stats uri /stats",
	} {
		assert.Contains(t, cfg, want)
	}
}

func TestConnectionEnds(t *testing.T) {
	log := `[WARNING]  (24296) : Server guards/guard0 is DOWN, reason: Layer4 connection problem
127.0.0.1:42328 [23/Nov/2026:07:37:40.573] webhooks guards/guard0 1/0/36 2230 -- 47/46/45/15/0 0/0
127.0.0.1:42329 [23/Nov/2026:07:37:40.574] webhooks guards/guard0 1/0/36 2230 SD 47/46/45/15/0 0/0
127.0.0.1:42330 [23/Nov/2026:07:37:40.575] webhooks guards/guard1 1/0/36 2230 CD 47/46/45/15/0 0/0
127.0.0.1:42331 [23/Nov/2026:07:37:40.576] webhooks guards/guard1 1/0/36 2230 -- 47/46/45/15/0 0/0
127.0.0.1:53986 [23/Nov/2026:07:37:38.723] stats stats/<STATS> 0/0/0 3883 LR 1/1/0/0/0 0/0
`
	assert.Equal(t, map[string]map[string]int{
		"guard0": {"--": 1, "SD": 1},
		"guard1": {"CD": 1, "--": 1},
	}, connectionEnds(log, "webhooks"))
}
