package main

import (
	"cmp"
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"log/slog"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	enumspb "go.temporal.io/api/enums/v1"
	"go.temporal.io/sdk/client"

	"github.com/claimflow/claimflow/activities"
	"github.com/claimflow/claimflow/workflows"
)

// auditReport compares what is on the consumed topics with what the
// consumer delivered. Every distinct event ID on the topics lands in exactly
// one of delivered, in_retry, dead_lettered, discarded, not_yet_consumed and
// lost.
type auditReport struct {
	Topics        []string `json:"topics"`
	MissingTopics []string `json:"missing_topics,omitempty"`
	Group         string   `json:"group"`
	// Records on the topics; Events distinct event IDs among them;
	// Republished the extra copies of an ID (a publisher's retry after a
	// lost ack), which the consumer must treat as one event.
	Records     int `json:"records"`
	Events      int `json:"events"`
	Republished int `json:"republished"`
	// Delivered have a notification, ViaWorkflow of them through the
	// DeliverEvent retry path.
	Delivered   int `json:"delivered"`
	ViaWorkflow int `json:"via_workflow"`
	// Lost were consumed (below the group's committed offset) yet have no
	// notification, no dead letter and no delivery run in progress.
	Lost int `json:"lost"`
	// Duplicates are notifications beyond the first for one event ID.
	Duplicates     int `json:"duplicates"`
	InRetry        int `json:"in_retry"`
	DeadLettered   int `json:"dead_lettered"`
	Discarded      int `json:"discarded"`
	NotYetConsumed int `json:"not_yet_consumed"`
	// Late events were delivered after a later event of their key; the
	// README promises that only retried events arrive late, so
	// LateInline must be 0.
	Late       int `json:"late"`
	LateInline int `json:"late_inline"`
	// Foreign notifications name these topics but no event on them (the
	// topic's retention removed it, or the topic was recreated).
	Foreign int `json:"foreign_notifications"`
	// LostIDs and DuplicateIDs list the first few, to start looking.
	LostIDs      []string `json:"lost_event_ids,omitempty"`
	DuplicateIDs []string `json:"duplicate_event_ids,omitempty"`
	Took         string   `json:"took"`
}

// OK is what the audit proves: nothing lost, nothing doubled, inline
// deliveries in key order.
func (r auditReport) OK() bool { return r.Lost == 0 && r.Duplicates == 0 && r.LateInline == 0 }

type auditInput struct {
	Kafka  activities.KafkaConfig
	Topics []string
	Group  string
	DB     *pgxpool.Pool
	// Temporal, when set, tells events still being retried from lost ones.
	Temporal client.Client
	// Show bounds LostIDs and DuplicateIDs.
	Show int
}

type delivered struct {
	topic     string
	partition int32
	offset    int64
	key       string
	path      string
	seq       int64
}

func audit(ctx context.Context, in auditInput) (auditReport, error) {
	began := time.Now()
	r := auditReport{Topics: in.Topics, Group: in.Group}
	records, missing, err := activities.ReadTopics(ctx, in.Kafka, in.Topics)
	if err != nil {
		return r, err
	}
	r.MissingTopics, r.Records = missing, len(records)
	// The first copy of an event ID is the event; later copies are
	// republishes.
	slices.SortFunc(records, func(a, b workflows.ConsumedEvent) int {
		if c := strings.Compare(a.Topic, b.Topic); c != 0 {
			return c
		}
		if c := cmp.Compare(a.Partition, b.Partition); c != 0 {
			return c
		}
		return cmp.Compare(a.Offset, b.Offset)
	})
	events := make(map[string]workflows.ConsumedEvent, len(records))
	partitions := map[string][]int32{}
	for _, rec := range records {
		if !slices.Contains(partitions[rec.Topic], rec.Partition) {
			partitions[rec.Topic] = append(partitions[rec.Topic], rec.Partition)
		}
		if _, ok := events[rec.EventID]; ok {
			r.Republished++
			continue
		}
		events[rec.EventID] = rec
	}
	r.Events = len(events)
	committed := map[string]map[int32]int64{}
	if len(partitions) > 0 {
		if committed, err = activities.CommittedOffsets(in.Kafka, in.Group, partitions); err != nil {
			return r, err
		}
	}

	notes, err := loadNotifications(ctx, in.DB, in.Topics)
	if err != nil {
		return r, err
	}
	rows, err := in.DB.Query(ctx, `
		SELECT event_id, count(*) FROM notifications WHERE topic = ANY($1)
		GROUP BY event_id HAVING count(*) > 1 ORDER BY event_id`, in.Topics)
	if err != nil {
		return r, fmt.Errorf("count duplicate notifications: %w", err)
	}
	for rows.Next() {
		var id string
		var n int
		if err := rows.Scan(&id, &n); err != nil {
			rows.Close()
			return r, err
		}
		r.Duplicates += n - 1
		if len(r.DuplicateIDs) < in.Show {
			r.DuplicateIDs = append(r.DuplicateIDs, id)
		}
	}
	rows.Close()
	if err := rows.Err(); err != nil {
		return r, fmt.Errorf("count duplicate notifications: %w", err)
	}
	parked := map[string]string{}
	rows, err = in.DB.Query(ctx, `SELECT event_id, status FROM dead_letters WHERE stage = 'consume' AND topic = ANY($1)`, in.Topics)
	if err != nil {
		return r, fmt.Errorf("read consume dead letters: %w", err)
	}
	for rows.Next() {
		var id, status string
		if err := rows.Scan(&id, &status); err != nil {
			rows.Close()
			return r, err
		}
		parked[id] = status
	}
	rows.Close()
	if err := rows.Err(); err != nil {
		return r, fmt.Errorf("read consume dead letters: %w", err)
	}

	var unaccounted []string
	for id, ev := range events {
		if n, ok := notes[id]; ok {
			r.Delivered++
			if n.path == "workflow" {
				r.ViaWorkflow++
			}
			continue
		}
		switch parked[id] {
		case string(workflows.DeadLetterDiscarded):
			r.Discarded++
			continue
		case string(workflows.DeadLetterOpen), string(workflows.DeadLetterRetrying):
			r.DeadLettered++
			continue
		}
		if next, ok := committed[ev.Topic][ev.Partition]; !ok || next < 0 || ev.Offset >= next {
			r.NotYetConsumed++
			continue
		}
		unaccounted = append(unaccounted, id)
	}
	running := runningDeliveries(ctx, in.Temporal, unaccounted)
	slices.Sort(unaccounted)
	for _, id := range unaccounted {
		if running[id] {
			r.InRetry++
			continue
		}
		r.Lost++
		if len(r.LostIDs) < in.Show {
			r.LostIDs = append(r.LostIDs, id)
		}
	}
	for id := range notes {
		if _, ok := events[id]; !ok {
			r.Foreign++
		}
	}
	r.Late, r.LateInline = lateDeliveries(events, notes)
	r.Took = time.Since(began).Round(time.Millisecond).String()
	return r, nil
}

func loadNotifications(ctx context.Context, db *pgxpool.Pool, topics []string) (map[string]delivered, error) {
	rows, err := db.Query(ctx, `
		SELECT event_id, topic, kafka_partition, kafka_offset, message_key, path, seq
		FROM notifications WHERE topic = ANY($1)`, topics)
	if err != nil {
		return nil, fmt.Errorf("read notifications: %w", err)
	}
	defer rows.Close()
	out := map[string]delivered{}
	for rows.Next() {
		var id string
		var d delivered
		if err := rows.Scan(&id, &d.topic, &d.partition, &d.offset, &d.key, &d.path, &d.seq); err != nil {
			return nil, fmt.Errorf("read notifications: %w", err)
		}
		out[id] = d
	}
	if err := rows.Err(); err != nil {
		return nil, fmt.Errorf("read notifications: %w", err)
	}
	return out, nil
}

// lateDeliveries counts, per topic and key, the delivered events that
// arrived (by seq) after an event behind them (by offset).
func lateDeliveries(events map[string]workflows.ConsumedEvent, notes map[string]delivered) (late, lateInline int) {
	type item struct {
		offset int64
		seq    int64
		inline bool
	}
	byKey := map[string][]item{}
	for id, ev := range events {
		n, ok := notes[id]
		if !ok {
			continue
		}
		k := ev.Topic + "\x00" + ev.Key
		byKey[k] = append(byKey[k], item{offset: ev.Offset, seq: n.seq, inline: n.path == "consumer"})
	}
	for _, items := range byKey {
		slices.SortFunc(items, func(a, b item) int { return cmp.Compare(b.offset, a.offset) })
		minLater := int64(-1)
		for _, it := range items {
			if minLater >= 0 && it.seq > minLater {
				late++
				if it.inline {
					lateInline++
				}
			}
			if minLater < 0 || it.seq < minLater {
				minLater = it.seq
			}
		}
	}
	return late, lateInline
}

// runningDeliveries asks Temporal which of the events still have a
// DeliverEvent run in progress (their inline attempt failed a moment ago).
func runningDeliveries(ctx context.Context, tc client.Client, ids []string) map[string]bool {
	out := map[string]bool{}
	if tc == nil || len(ids) == 0 {
		return out
	}
	var (
		mu  sync.Mutex
		wg  sync.WaitGroup
		sem = make(chan struct{}, 16)
	)
	for _, id := range ids {
		sem <- struct{}{}
		wg.Go(func() {
			defer func() { <-sem }()
			resp, err := tc.DescribeWorkflowExecution(ctx, workflows.DeliverEventWorkflowID(id), "")
			if err != nil {
				return
			}
			if resp.GetWorkflowExecutionInfo().GetStatus() == enumspb.WORKFLOW_EXECUTION_STATUS_RUNNING {
				mu.Lock()
				out[id] = true
				mu.Unlock()
			}
		})
	}
	wg.Wait()
	return out
}

func (r auditReport) writeText(w io.Writer) {
	fmt.Fprintf(w, "audit of %s (group %s) against the notifications table, in %s\n", strings.Join(r.Topics, ", "), r.Group, r.Took)
	if len(r.MissingTopics) > 0 {
		fmt.Fprintf(w, "  topics that do not exist:     %s\n", strings.Join(r.MissingTopics, ", "))
	}
	fmt.Fprintf(w, "  records on the topics         %d (%d distinct event IDs, %d republished copies)\n", r.Records, r.Events, r.Republished)
	fmt.Fprintf(w, "  delivered                     %d (%d through the retry path)\n", r.Delivered, r.ViaWorkflow)
	fmt.Fprintf(w, "  lost                          %d\n", r.Lost)
	fmt.Fprintf(w, "  duplicates                    %d\n", r.Duplicates)
	fmt.Fprintf(w, "  in retry                      %d\n", r.InRetry)
	fmt.Fprintf(w, "  dead-lettered (open)          %d\n", r.DeadLettered)
	fmt.Fprintf(w, "  discarded by an operator      %d\n", r.Discarded)
	fmt.Fprintf(w, "  not yet consumed              %d\n", r.NotYetConsumed)
	fmt.Fprintf(w, "  delivered after a later event of their key: %d (inline: %d)\n", r.Late, r.LateInline)
	if r.Foreign > 0 {
		fmt.Fprintf(w, "  notifications of events no longer on the topics: %d\n", r.Foreign)
	}
	if len(r.LostIDs) > 0 {
		fmt.Fprintf(w, "  lost, first ones: %s\n", strings.Join(r.LostIDs, " "))
	}
	if len(r.DuplicateIDs) > 0 {
		fmt.Fprintf(w, "  duplicated, first ones: %s\n", strings.Join(r.DuplicateIDs, " "))
	}
	if r.OK() {
		fmt.Fprintln(w, "OK: no event lost, none delivered twice, inline deliveries in key order")
	} else {
		fmt.Fprintln(w, "FAILED: see lost, duplicates and inline order above")
	}
}

var errAuditFailed = errors.New("audit found lost, duplicated or reordered notifications")

func runAudit(ctx context.Context, cfg config, log *slog.Logger, args []string, out io.Writer) error {
	fs := flag.NewFlagSet("audit", flag.ContinueOnError)
	topics := fs.String("topics", strings.Join(cfg.ConsumerTopics, ","), "comma-separated topics to audit (CONSUMER_TOPICS)")
	group := fs.String("group", cfg.ConsumerGroup, "the consumer group whose committed offsets say what was consumed (CONSUMER_GROUP)")
	asJSON := fs.Bool("json", false, "print the report as JSON")
	show := fs.Int("show", 20, "list at most this many lost or duplicated event IDs")
	useTemporal := fs.Bool("temporal", true, "ask Temporal whether undelivered events are still being retried")
	fs.Usage = func() {
		fmt.Fprintln(fs.Output(), "usage: claimflow audit [flags]")
		fmt.Fprintln(fs.Output(), "exits 1 when an event was lost, delivered twice, or delivered inline out of key order")
		fs.PrintDefaults()
	}
	if err := fs.Parse(args); err != nil {
		return err
	}
	pool, err := openDB(ctx, cfg, 4)
	if err != nil {
		return err
	}
	defer pool.Close()
	in := auditInput{Kafka: kafkaConfig(cfg, "claimflow-audit"), Topics: splitList(*topics), Group: *group, DB: pool, Show: *show}
	if *useTemporal {
		tc, err := dialTemporal(ctx, cfg, log, nil)
		if err != nil {
			log.Warn("Temporal unreachable; undelivered consumed events count as lost", "error", err)
		} else {
			defer tc.Close()
			in.Temporal = tc
		}
	}
	r, err := audit(ctx, in)
	if err != nil {
		return err
	}
	if *asJSON {
		enc := json.NewEncoder(out)
		enc.SetIndent("", "  ")
		if err := enc.Encode(r); err != nil {
			return err
		}
	} else {
		r.writeText(out)
	}
	if !r.OK() {
		return errAuditFailed
	}
	return nil
}
