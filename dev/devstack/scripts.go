package devstack

import (
	"bufio"
	"bytes"
	"context"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"time"
)

// ScriptCluster is a cluster run by one of the repository's scripts,
// deploy/temporal/server.sh or deploy/kafka/kafka.sh: several OS processes
// that outlive a Go process, started, faulted and stopped through the
// script's subcommands. The scripts are what CI and the docs use; this
// only calls them.
type ScriptCluster struct {
	// Script is the script's absolute path, Dir the --dir it runs in.
	Script, Dir string
	// Value is what the start's last line assigned (NAME=value).
	Value string
	// LogFile gets the scripts' output.
	LogFile string
}

// RepoScript is the absolute path of rel (e.g. deploy/kafka/kafka.sh) in
// the checkout that holds the working directory. The production-shaped
// stack needs one; `claimflow dev` alone does not.
func RepoScript(rel string) (string, error) {
	wd, err := os.Getwd()
	if err != nil {
		return "", fmt.Errorf("locate %s: %w", rel, err)
	}
	root, err := findRepoRoot(wd)
	if err != nil {
		return "", fmt.Errorf("locate %s: %w", rel, err)
	}
	p := filepath.Join(root, rel)
	if !isExecutable(p) {
		return "", fmt.Errorf("%s is not an executable script", p)
	}
	return p, nil
}

// TemporalClusterOptions configures StartTemporalCluster.
type TemporalClusterOptions struct {
	// Dir keeps the node configs, logs and PIDs.
	Dir string
	// PGURL names a PostgreSQL role that may create the databases
	// temporal and temporal_visibility.
	PGURL string
	// BasePort is the frontend's gRPC port; the other ports follow it
	// (deploy/temporal/server.sh).
	BasePort int
	// TLSDir, when set, makes every gRPC port require mutual TLS with the
	// CA and node certificate there (server.sh --tls).
	TLSDir   string
	LogFile  string
	Progress io.Writer
}

// StartTemporalCluster builds the Temporal server once (server.sh fetch)
// and starts frontend, matching, worker and two history processes on
// PostgreSQL. Value is the frontend's address.
func StartTemporalCluster(ctx context.Context, o TemporalClusterOptions) (*ScriptCluster, error) {
	args := []string{"--dir", o.Dir, "--pg-url", o.PGURL, "--base-port", strconv.Itoa(o.BasePort)}
	if o.TLSDir != "" {
		args = append(args, "--tls", o.TLSDir)
	}
	return startScript(ctx, "deploy/temporal/server.sh", o.Dir, o.LogFile, o.Progress,
		"the Temporal server: 5 processes on PostgreSQL", "TEMPORAL_ADDRESS", args...)
}

// KafkaClusterOptions configures StartKafkaCluster.
type KafkaClusterOptions struct {
	Dir      string
	Nodes    int
	BasePort int
	LogFile  string
	Progress io.Writer
}

// StartKafkaCluster fetches Apache Kafka once (kafka.sh fetch) and starts
// a fresh cluster of o.Nodes brokers. Value is the bootstrap list.
func StartKafkaCluster(ctx context.Context, o KafkaClusterOptions) (*ScriptCluster, error) {
	return startScript(ctx, "deploy/kafka/kafka.sh", o.Dir, o.LogFile, o.Progress,
		fmt.Sprintf("Apache Kafka: %d brokers", o.Nodes), "KAFKA_BROKERS",
		"--nodes", strconv.Itoa(o.Nodes), "--base-port", strconv.Itoa(o.BasePort), "--dir", o.Dir)
}

// startScript runs rel's fetch (a no-op once cached), then its start with
// args, and reads the start's last NAME=value line.
func startScript(ctx context.Context, rel, dir, logFile string, w io.Writer, what, name string, args ...string) (*ScriptCluster, error) {
	script, err := RepoScript(rel)
	if err != nil {
		return nil, err
	}
	c := &ScriptCluster{Script: script, Dir: dir, LogFile: logFile}
	progress(w, fmt.Sprintf("fetching %s once, if not cached (%s fetch)...", what, rel))
	if _, err := c.run(ctx, "fetch"); err != nil {
		return nil, err
	}
	progress(w, fmt.Sprintf("starting %s (%s start)...", what, rel))
	out, err := c.run(ctx, append([]string{"start"}, args...)...)
	if err != nil {
		return nil, err
	}
	if c.Value, err = lastAssignment(out, name); err != nil {
		return nil, err
	}
	return c, nil
}

// KillNode kills one node with SIGKILL (server.sh: frontend, history-1,
// matching, history-2, worker; kafka.sh: 0, 1, 2).
func (c *ScriptCluster) KillNode(ctx context.Context, node string) error {
	_, err := c.run(ctx, "kill-node", node, "--dir", c.Dir)
	return err
}

// StartNode starts a node that KillNode stopped.
func (c *ScriptCluster) StartNode(ctx context.Context, node string) error {
	_, err := c.run(ctx, "start-node", node, "--dir", c.Dir)
	return err
}

// Stop stops every node.
func (c *ScriptCluster) Stop(ctx context.Context) error {
	_, err := c.run(ctx, "stop", "--dir", c.Dir)
	return err
}

// run runs the script; its stderr (the progress) goes to the log file,
// and its stdout is returned and logged too.
func (c *ScriptCluster) run(ctx context.Context, args ...string) (string, error) {
	log, err := openAppend(c.LogFile)
	if err != nil {
		return "", err
	}
	defer log.Close()
	fmt.Fprintf(log, "%s %s %s\n", time.Now().Format(time.RFC3339), filepath.Base(c.Script), strings.Join(args, " "))
	var out bytes.Buffer
	cmd := exec.CommandContext(ctx, c.Script, args...)
	cmd.Stdout = io.MultiWriter(&out, log)
	cmd.Stderr = log
	if err := cmd.Run(); err != nil {
		return "", withTail(fmt.Errorf("%s %s: %w", filepath.Base(c.Script), args[0], err), c.LogFile)
	}
	return out.String(), nil
}

// lastAssignment is the value of the last NAME=value line of out.
func lastAssignment(out, name string) (string, error) {
	value := ""
	sc := bufio.NewScanner(strings.NewReader(out))
	for sc.Scan() {
		if v, ok := strings.CutPrefix(strings.TrimSpace(sc.Text()), name+"="); ok {
			value = v
		}
	}
	if value == "" {
		return "", fmt.Errorf("the script printed no %s= line", name)
	}
	return value, nil
}

func progress(w io.Writer, msg string) {
	if w != nil {
		fmt.Fprintln(w, msg)
	}
}
