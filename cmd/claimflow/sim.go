package main

import (
	"context"
	"flag"
	"fmt"
	"log/slog"
	"time"

	"github.com/claimflow/claimflow/internal/notifysim"
	"github.com/claimflow/claimflow/internal/payoutsim"
)

// simulator is a running payout or notification simulator.
type simulator interface {
	Close(ctx context.Context) error
}

// runSimulator is `claimflow payoutsim` and `claimflow notifysim`: the
// simulators 'claimflow dev' runs in its own process, served on their own
// (compose's demo profile runs them as services). They keep their state in
// memory until a signal.
func runSimulator(ctx context.Context, log *slog.Logger, cmd string, args []string) error {
	fs := flag.NewFlagSet(cmd, flag.ContinueOnError)
	var defaultPort int
	switch cmd {
	case "payoutsim":
		defaultPort = 8090
	case "notifysim":
		defaultPort = 8091
	}
	addr := fs.String("addr", fmt.Sprintf("127.0.0.1:%d", defaultPort), "listen address")
	if err := fs.Parse(args); err != nil {
		return err
	}
	var (
		sim simulator
		url string
	)
	switch cmd {
	case "payoutsim":
		s, err := payoutsim.Start(*addr)
		if err != nil {
			return err
		}
		sim, url = s, s.PayoutsURL()
	case "notifysim":
		s, err := notifysim.Start(*addr)
		if err != nil {
			return err
		}
		sim, url = s, s.WebhookURL()
	}
	log.Info(cmd+" serving", "addr", *addr, "url", url)
	<-ctx.Done()
	stopCtx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	if err := sim.Close(stopCtx); err != nil {
		return fmt.Errorf("stop %s: %w", cmd, err)
	}
	return nil
}
