package main

import (
	"context"
	"log/slog"
	"os"
	"reflect"
	"strings"
	"testing"
	"time"

	"github.com/claimflow/claimflow/cmd/internal/services"
	appconfig "github.com/claimflow/claimflow/internal/config"
)

// TestOutsideEnvGivesTheStacksSettings: `claimflow api`, `worker` and
// `consumer` started with the environment `claimflow dev --services none`
// prints run on the configuration the stack gives its own services — the
// same addresses, and the same batch size, compression and simulators —
// so that what runs apart is what runs in one process.
func TestOutsideEnvGivesTheStacksSettings(t *testing.T) {
	if testing.Short() {
		t.Skip("starts the dev stack")
	}
	o := testStackOptions(t, dataDir(t))
	if err := o.ChooseServices("none"); err != nil {
		t.Fatal(err)
	}
	cfg, err := appconfig.Load()
	if err != nil {
		t.Fatal(err)
	}
	log := slog.New(slog.NewTextHandler(testWriter{t}, &slog.HandlerOptions{Level: slog.LevelWarn}))
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Minute)
	defer cancel()
	s, err := startStack(ctx, cfg, log, o)
	if err != nil {
		t.Fatalf("start stack: %v", err)
	}
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
		defer cancel()
		if err := s.Stop(ctx); err != nil {
			t.Errorf("stop stack: %v", err)
		}
	})

	for _, e := range s.OutsideEnv() {
		v := e.Value
		if e.FromFile {
			b, err := os.ReadFile(v)
			if err != nil {
				t.Fatalf("%s: %v", e.Name, err)
			}
			v = strings.TrimSpace(string(b))
		}
		t.Setenv(e.Name, v)
	}
	outside, err := appconfig.Load()
	if err != nil {
		t.Fatalf("load the printed environment: %v", err)
	}

	// What each process chooses for itself, or the services never read.
	own := map[string]string{
		"HTTPAddr":           "each API listens where it is told",
		"MigrateDatabaseURL": "printed on its own line: only migrate and the bench's peer use it",
		"InsecureNoAuth":     "a flag of the command, not the environment",
	}
	var diffs []string
	var compare func(prefix string, a, b reflect.Value)
	compare = func(prefix string, a, b reflect.Value) {
		for i := 0; i < a.NumField(); i++ {
			f := a.Type().Field(i)
			if !f.IsExported() || own[f.Name] != "" {
				continue
			}
			if f.Type.Kind() == reflect.Struct && f.Type.PkgPath() == a.Type().PkgPath() {
				compare(prefix+f.Name+".", a.Field(i), b.Field(i))
				continue
			}
			if !reflect.DeepEqual(a.Field(i).Interface(), b.Field(i).Interface()) {
				diffs = append(diffs, prefix+f.Name)
				t.Errorf("%s%s: the printed environment gives %v, the stack's own services run with %v",
					prefix, f.Name, a.Field(i).Interface(), b.Field(i).Interface())
			}
		}
	}
	compare("", reflect.ValueOf(outside), reflect.ValueOf(s.Config))
	if len(diffs) > 0 {
		t.Logf("printed: %s", services.ShellLine(s.OutsideEnv()))
	}
}
