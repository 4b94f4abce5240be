package services

import (
	"context"
	"fmt"
	"log/slog"
	"time"

	"github.com/claimflow/claimflow/dev/notifysim"
	"github.com/claimflow/claimflow/dev/payoutsim"
)

// Simulators are the simulators `claimflow dev` runs, by the subcommand
// that serves one alone, with its default port (dev's --payout-port and
// --notify-port).
var Simulators = map[string]int{"payoutsim": 8090, "notifysim": 8091}

// RunSimulator serves the payout ("payoutsim") or notification
// ("notifysim") simulator on addr until ctx ends (compose's demo profile
// runs them as services). Their state is in memory.
func RunSimulator(ctx context.Context, log *slog.Logger, name, addr string) error {
	var (
		closeSim func(context.Context) error
		url      string
	)
	switch name {
	case "payoutsim":
		s, err := payoutsim.Start(addr)
		if err != nil {
			return err
		}
		closeSim, url = s.Close, s.PayoutsURL()
	case "notifysim":
		s, err := notifysim.Start(addr)
		if err != nil {
			return err
		}
		closeSim, url = s.Close, s.WebhookURL()
	default:
		return fmt.Errorf("no simulator %q (want payoutsim or notifysim)", name)
	}
	log.Info(name+" serving", "addr", addr, "url", url)
	<-ctx.Done()
	stopCtx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	if err := closeSim(stopCtx); err != nil {
		return fmt.Errorf("stop %s: %w", name, err)
	}
	return nil
}
