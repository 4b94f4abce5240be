package temporalconn_test

import (
	"context"
	"fmt"
	"net"
	"os"
	"path/filepath"
	"testing"
	"time"

	"go.temporal.io/api/workflowservice/v1"
	"go.temporal.io/sdk/client"

	"github.com/claimflow/claimflow/dev/devstack"
	"github.com/claimflow/claimflow/dev/testcerts"
	"github.com/claimflow/claimflow/internal/config"
	"github.com/claimflow/claimflow/internal/temporalconn"
	"github.com/claimflow/claimflow/internal/tlsfiles"
)

// TestMutualTLSOnARealServer runs the Temporal server as production does
// (deploy/temporal/server.sh: five processes on PostgreSQL) with mutual TLS
// required on every port, and dials it the way every claimflow process
// does: a certificate of the server's CA connects, one of another CA is
// refused, and a certificate rotated in place is used by the next
// connection of the same client configuration, with no restart.
func TestMutualTLSOnARealServer(t *testing.T) {
	if testing.Short() {
		t.Skip("starts PostgreSQL and the Temporal server (built once by server.sh fetch)")
	}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Minute)
	defer cancel()
	dir := t.TempDir()
	// PostgreSQL may run as another OS user (root runs it as postgres):
	// let it into the test's directory.
	if err := os.Chmod(dir, 0o755); err != nil {
		t.Fatal(err)
	}
	ports, err := devstack.FreePorts(1)
	if err != nil {
		t.Fatal(err)
	}
	pg, err := devstack.StartPostgres(ctx, devstack.PostgresOptions{DataDir: filepath.Join(dir, "pg"), Port: ports[0]})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = pg.Stop(context.Background()) })

	serverCA, otherCA := testcerts.NewCA(t, "temporal-ca"), testcerts.NewCA(t, "someone-else")
	tlsDir := filepath.Join(dir, "tls")
	if err := os.Mkdir(tlsDir, 0o755); err != nil {
		t.Fatal(err)
	}
	serverCA.WriteCA(t, tlsDir, "ca.pem")
	serverCA.WritePair(t, tlsDir, "node", "temporal-node", "127.0.0.1", "localhost")

	base := freeBase(t)
	cluster, err := devstack.StartTemporalCluster(ctx, devstack.TemporalClusterOptions{
		Dir: filepath.Join(dir, "temporal"), PGURL: pg.URL, BasePort: base, TLSDir: tlsDir,
		LogFile: filepath.Join(dir, "temporal.log"),
	})
	if err != nil {
		b, _ := os.ReadFile(filepath.Join(dir, "temporal.log"))
		t.Fatalf("%v\n%s", err, b)
	}
	t.Cleanup(func() { _ = cluster.Stop(context.Background()) })

	clientDir := filepath.Join(dir, "client")
	if err := os.Mkdir(clientDir, 0o755); err != nil {
		t.Fatal(err)
	}
	ca := serverCA.WriteCA(t, clientDir, "ca.pem")
	cfgWith := func(cert, key string) config.Config {
		return config.Config{TemporalAddress: cluster.Value, Namespace: "default", TemporalTLS: tlsfiles.Files{
			Enabled: true, CA: ca, Cert: cert, Key: key, ServerName: "localhost",
			Vars: tlsfiles.Vars{Enabled: "TEMPORAL_TLS", CA: "CA", Cert: "CERT", Key: "KEY", ServerName: "NAME"}}}
	}
	dialCtx := func() (context.Context, context.CancelFunc) { return context.WithTimeout(ctx, 15*time.Second) }

	t.Run("a certificate of the server's CA connects", func(t *testing.T) {
		cert, key := serverCA.WritePair(t, clientDir, "good", "claimflow-worker")
		dctx, cancel := dialCtx()
		defer cancel()
		c, err := temporalconn.Dial(dctx, cfgWith(cert, key), client.Options{})
		if err != nil {
			t.Fatal(err)
		}
		defer c.Close()
		if _, err := c.WorkflowService().DescribeNamespace(dctx, describe("default")); err != nil {
			t.Fatalf("describe namespace over mTLS: %v", err)
		}
	})
	t.Run("plaintext is refused", func(t *testing.T) {
		dctx, cancel := dialCtx()
		defer cancel()
		if c, err := temporalconn.Dial(dctx, config.Config{TemporalAddress: cluster.Value, Namespace: "default"}, client.Options{}); err == nil {
			c.Close()
			t.Fatal("connected in plaintext to a server that requires mTLS")
		}
	})
	t.Run("no client certificate is refused", func(t *testing.T) {
		dctx, cancel := dialCtx()
		defer cancel()
		if c, err := temporalconn.Dial(dctx, cfgWith("", ""), client.Options{}); err == nil {
			c.Close()
			t.Fatal("connected without a client certificate")
		}
	})
	t.Run("a certificate of another CA is refused", func(t *testing.T) {
		cert, key := otherCA.WritePair(t, clientDir, "untrusted", "intruder")
		dctx, cancel := dialCtx()
		defer cancel()
		c, err := temporalconn.Dial(dctx, cfgWith(cert, key), client.Options{})
		if err == nil {
			c.Close()
			t.Fatal("connected with a certificate the server's CA did not sign")
		}
		t.Logf("refused as it should be: %v", err)
	})
	t.Run("a rotated certificate is picked up without a restart", func(t *testing.T) {
		// One client configuration throughout, as in a running worker: its
		// files first hold a certificate the server refuses, then are
		// rewritten in place with a good one.
		cert, key := otherCA.WritePair(t, clientDir, "rotating", "claimflow-api")
		var o client.Options
		if err := temporalconn.Apply(cfgWith(cert, key), &o); err != nil {
			t.Fatal(err)
		}
		dctx, cancel := dialCtx()
		c, err := client.DialContext(dctx, o)
		cancel()
		if err == nil {
			c.Close()
			t.Fatal("connected before the rotation, with a certificate of another CA")
		}
		serverCA.WritePair(t, clientDir, "rotating", "claimflow-api")
		dctx, cancel = dialCtx()
		defer cancel()
		c, err = client.DialContext(dctx, o)
		if err != nil {
			t.Fatalf("the rotated certificate was not used: %v", err)
		}
		defer c.Close()
		if _, err := c.WorkflowService().DescribeNamespace(dctx, describe("default")); err != nil {
			t.Fatal(err)
		}
	})
}

// freeBase is a base port whose server.sh ports (base+0..4, +10,
// +100..104, +200..204) are all free.
func freeBase(t *testing.T) int {
	t.Helper()
	for range 20 {
		p, err := devstack.FreePort()
		if err != nil {
			t.Fatal(err)
		}
		base := p - p%1000 + 233
		ok := true
		for _, off := range []int{0, 1, 2, 3, 4, 10, 100, 101, 102, 103, 104, 200, 201, 202, 203, 204} {
			l, err := net.Listen("tcp", fmt.Sprintf("127.0.0.1:%d", base+off))
			if err != nil {
				ok = false
				break
			}
			l.Close()
		}
		if ok && base > 1024 {
			return base
		}
	}
	t.Fatal("no free base port for the Temporal server")
	return 0
}

func describe(ns string) *workflowservice.DescribeNamespaceRequest {
	return &workflowservice.DescribeNamespaceRequest{Namespace: ns}
}
