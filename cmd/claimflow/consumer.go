package main

import (
	"context"
	"flag"
	"fmt"
	"log/slog"
	"strings"

	"github.com/jackc/pgx/v5/pgxpool"
	"go.temporal.io/sdk/client"

	"github.com/claimflow/claimflow/activities"
)

// notifySink is the notification sink every process shares: the consumer
// delivers inline through it and the worker's DeliverEvent runs retry
// through it, so both must see the same NOTIFY_WEBHOOK_URL.
func notifySink(cfg config, pool *pgxpool.Pool) *activities.Sink {
	return &activities.Sink{DB: pool, WebhookURL: cfg.NotifyWebhookURL}
}

// consumerService is a running event consumer.
type consumerService struct {
	Consumer *activities.Consumer
	cancel   context.CancelFunc
	done     chan struct{} // closed when Run returned; err says why
	err      error
}

func startConsumer(cfg config, log *slog.Logger, pool *pgxpool.Pool, tc client.Client, tel *telemetry) (*consumerService, error) {
	c, err := activities.NewConsumer(activities.ConsumerConfig{
		Kafka:    kafkaConfig(cfg, "claimflow-consumer"),
		Group:    cfg.ConsumerGroup,
		Topics:   cfg.ConsumerTopics,
		Sink:     notifySink(cfg, pool),
		Temporal: tc,
		Log:      log.With("component", "consumer"),
		MaxBatch: cfg.ConsumerBatch,
		Metrics:  tel.Activities,
	})
	if err != nil {
		return nil, err
	}
	ctx, cancel := context.WithCancel(context.Background())
	s := &consumerService{Consumer: c, cancel: cancel, done: make(chan struct{})}
	go func() {
		defer close(s.done)
		s.err = c.Run(ctx)
	}()
	log.Info("consumer started", "group", cfg.ConsumerGroup, "topics", cfg.ConsumerTopics,
		"webhook", cfg.NotifyWebhookURL)
	return s, nil
}

// Stop ends consumption: batches in flight finish (or stay uncommitted),
// then the consumer leaves its group so its partitions move at once.
func (s *consumerService) Stop() error {
	s.cancel()
	<-s.done
	return s.err
}

func runConsumerCommand(ctx context.Context, cfg config, log *slog.Logger, args []string) error {
	fs := flag.NewFlagSet("consumer", flag.ContinueOnError)
	topics := fs.String("topics", strings.Join(cfg.ConsumerTopics, ","), "comma-separated topics to consume (CONSUMER_TOPICS)")
	fs.StringVar(&cfg.ConsumerGroup, "group", cfg.ConsumerGroup, "consumer group (CONSUMER_GROUP)")
	migrate := fs.Bool("migrate", true, "apply database migrations before consuming")
	if err := fs.Parse(args); err != nil {
		return err
	}
	cfg.ConsumerTopics = splitList(*topics)
	conn, err := connect(ctx, cfg, log, 32, *migrate, cfg.MetricsAddr)
	if err != nil {
		return err
	}
	defer conn.Close()
	pool, tc, tel := conn.Pool, conn.Temporal, conn.Telemetry
	svc, err := startConsumer(cfg, log, pool, tc, tel)
	if err != nil {
		return err
	}
	select {
	case <-ctx.Done():
	case <-svc.done:
		return fmt.Errorf("consumer stopped: %w", svc.err)
	}
	log.Info("shutting down consumer")
	return svc.Stop()
}

func splitList(s string) []string {
	var out []string
	for _, x := range strings.Split(s, ",") {
		if x = strings.TrimSpace(x); x != "" {
			out = append(out, x)
		}
	}
	return out
}
