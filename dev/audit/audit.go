// Package audit checks the delivery guarantee (docs/testing.md, "The
// delivery guarantee") of consumed topics: it reads every record on the
// topics, the group's committed offsets, the notifications table and, when
// there is one, the webhook receiver's ledger, and reports what was lost,
// duplicated, reordered or is still in flight.
package audit

import (
	"cmp"
	"context"
	"crypto/sha256"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/IBM/sarama"
	"github.com/jackc/pgx/v5/pgxpool"
	enumspb "go.temporal.io/api/enums/v1"
	"go.temporal.io/sdk/client"

	"github.com/claimflow/claimflow/dev/notifysim"
	"github.com/claimflow/claimflow/internal/kafka"
	"github.com/claimflow/claimflow/internal/store"
	"github.com/claimflow/claimflow/workflows"
)

// Report is the audit of the delivery guarantee (docs/testing.md, "The delivery
// guarantee") on consumed topics against the notifications table, and
// against the webhook receiver's ledger when it has one. Every distinct
// event ID on the topics lands in exactly one of delivered, in_retry,
// dead_lettered, discarded, not_yet_consumed and lost.
type Report struct {
	Topics        []string `json:"topics"`
	MissingTopics []string `json:"missing_topics,omitempty"`
	Group         string   `json:"group"`
	// Records on the topics; Events distinct event IDs among them.
	Records int `json:"records"`
	Events  int `json:"events"`
	// Redelivered counts the copies of an event ID beyond the first, with
	// the same payload: the topic is at-least-once (a publisher's retry
	// after a lost ack), the consumer treats them as one event. Not a fault.
	Redelivered int `json:"redelivered"`
	// PayloadMismatches are event IDs whose copies differ: two events under
	// one ID, of which the consumer keeps one and silently drops the other.
	PayloadMismatches int `json:"payload_mismatches"`
	// ClaimDuplicates are events that repeat another event's type and data
	// under a different event ID: a republish whose ID was not derived from
	// the claim, which no consumer can dedupe.
	ClaimDuplicates int `json:"claim_duplicates"`
	// Delivered have a notification, ViaWorkflow of them through the
	// DeliverEvent retry path.
	Delivered   int `json:"delivered"`
	ViaWorkflow int `json:"via_workflow"`
	// Lost were consumed (below the group's committed offset) yet have no
	// notification, no dead letter and no delivery run in progress.
	Lost int `json:"lost"`
	// DuplicateEffects are notification rows beyond the first for one
	// claim (topic, event type and data) under different event IDs: the
	// student notified twice. The event ID is the table's primary key, so
	// a second row can only come under another ID; that is where to look.
	DuplicateEffects int `json:"duplicate_effects"`
	InRetry          int `json:"in_retry"`
	DeadLettered     int `json:"dead_lettered"`
	Discarded        int `json:"discarded"`
	NotYetConsumed   int `json:"not_yet_consumed"`
	// Late events were delivered after a later event of their key; the
	// README promises that only retried events arrive late, so
	// LateInline must be 0.
	Late       int `json:"late"`
	LateInline int `json:"late_inline"`
	// Orphans are notifications whose position is still kept on the topic
	// but which name no event there: a row without an event. Expired ones
	// point below the oldest offset kept (retention removed the event).
	Orphans int `json:"orphan_notifications"`
	Expired int `json:"expired_notifications"`
	// Webhook sums up the receiver's ledger (-webhook-ledger): re-sends
	// under one idempotency key are at-least-once, a key taking effect twice
	// or changing its body is a fault.
	Webhook *notifysim.Ledger `json:"webhook,omitempty"`
	// Waitlist is the waitlists' invariants (store.AuditWaitlist): no free
	// seat while someone waits, promotions first come first served and
	// once each, counters true.
	Waitlist *store.WaitlistReport `json:"waitlist,omitempty"`
	// Reservations says who holds each enrollment still reserved, when
	// Temporal is there to ask (CheckReservations).
	Reservations *ReservationReport `json:"reservations,omitempty"`
	// The first few IDs of each fault, to start looking.
	LostIDs      []string `json:"lost_event_ids,omitempty"`
	DuplicateIDs []string `json:"duplicate_effect_event_ids,omitempty"`
	MismatchIDs  []string `json:"payload_mismatch_event_ids,omitempty"`
	ClaimIDs     []string `json:"claim_duplicate_event_ids,omitempty"`
	OrphanIDs    []string `json:"orphan_event_ids,omitempty"`
	Took         string   `json:"took"`
}

// OK is what the audit proves: nothing lost, no effect twice, copies of an
// event identical, no row without an event, inline deliveries in key order.
// Redelivered copies and webhook re-sends are the guarantee working, not a
// fault.
func (r Report) OK() bool {
	return r.Lost == 0 && r.DuplicateEffects == 0 && r.PayloadMismatches == 0 && r.ClaimDuplicates == 0 &&
		r.Orphans == 0 && r.LateInline == 0 && (r.Webhook == nil || r.Webhook.OK()) && (r.Waitlist == nil || r.Waitlist.OK()) &&
		(r.Reservations == nil || r.Reservations.OK())
}

// Input is what Run reads.
type Input struct {
	Kafka  kafka.Config
	Topics []string
	Group  string
	DB     *pgxpool.Pool
	// Temporal, when set, tells events still being retried from lost ones.
	Temporal client.Client
	// Webhook, when set, returns the receiver's delivery attempts of the
	// topics (the simulator's ledger).
	Webhook func(ctx context.Context, topics []string) ([]notifysim.Delivery, error)
	// Show bounds the listed IDs.
	Show int
	// Namespace is Temporal's, where the runs that hold reservations are.
	Namespace string
	// RecoveryBound is how long a reservation may be orphaned before the
	// recovery must have given it a run (config.Config.RecoveryBound).
	RecoveryBound time.Duration
}

type delivered struct {
	topic     string
	partition int32
	offset    int64
	key       string
	path      string
	seq       int64
	// claim is the event type and data: one effect per claim.
	claim string
}

// topicRecord is a record as the audit sees it: its event, a digest of its
// value to compare copies with, and its claim (type and data, canonical).
type topicRecord struct {
	workflows.ConsumedEvent
	digest [sha256.Size]byte
	claim  string
}

// topicState is what the audit reads from Kafka.
type topicState struct {
	records []topicRecord
	// oldest kept offset per topic and partition
	oldest    map[string]map[int32]int64
	committed map[string]map[int32]int64
}

// Run audits in.Topics as consumed by in.Group.
func Run(ctx context.Context, in Input) (Report, error) {
	began := time.Now()
	r := Report{Topics: in.Topics, Group: in.Group}
	ts, missing, err := readTopicRecords(ctx, in.Kafka, in.Topics)
	if err != nil {
		return r, err
	}
	r.MissingTopics = missing
	if len(ts.oldest) > 0 {
		partitions := map[string][]int32{}
		for topic, ps := range ts.oldest {
			for p := range ps {
				partitions[topic] = append(partitions[topic], p)
			}
		}
		if ts.committed, err = kafka.CommittedOffsets(in.Kafka, in.Group, partitions); err != nil {
			return r, err
		}
	}
	notes, err := loadNotifications(ctx, in.DB, in.Topics)
	if err != nil {
		return r, err
	}
	parked, err := loadConsumeDeadLetters(ctx, in.DB, in.Topics)
	if err != nil {
		return r, err
	}
	var ledger []notifysim.Delivery
	if in.Webhook != nil {
		if ledger, err = in.Webhook(ctx, in.Topics); err != nil {
			return r, fmt.Errorf("read the webhook's ledger: %w", err)
		}
	}
	running := func(ids []string) map[string]bool { return runningDeliveries(ctx, in.Temporal, ids) }
	r = assess(r, ts, notes, parked, running, ledger, in.Webhook != nil, in.Show)
	wl, err := store.AuditWaitlist(ctx, in.DB, "")
	if err != nil {
		return r, err
	}
	r.Waitlist = &wl
	if in.Temporal != nil {
		rr, err := CheckReservations(ctx, in.DB, in.Temporal, in.Namespace, "", in.RecoveryBound)
		if err != nil {
			return r, err
		}
		r.Reservations = &rr
	}
	r.Took = time.Since(began).Round(time.Millisecond).String()
	return r, nil
}

// assess is the audit's judgement on what was read, kept free of I/O so
// that each fault it must catch has a unit test (audit_test.go).
func assess(r Report, ts topicState, notes map[string]delivered, parked map[string]string,
	running func([]string) map[string]bool, ledger []notifysim.Delivery, withLedger bool, show int) Report {
	list := func(ids *[]string, id string) {
		if len(*ids) < show {
			*ids = append(*ids, id)
		}
	}
	records := ts.records
	r.Records = len(records)
	// The first copy of an event ID is the event; later copies are
	// redeliveries and must carry the same value.
	slices.SortFunc(records, func(a, b topicRecord) int {
		if c := strings.Compare(a.Topic, b.Topic); c != 0 {
			return c
		}
		if c := cmp.Compare(a.Partition, b.Partition); c != 0 {
			return c
		}
		return cmp.Compare(a.Offset, b.Offset)
	})
	events := make(map[string]topicRecord, len(records))
	mismatched := map[string]bool{}
	claims := map[string]string{} // topic+claim → first event ID
	for _, rec := range records {
		if first, ok := events[rec.EventID]; ok {
			r.Redelivered++
			if rec.digest != first.digest && !mismatched[rec.EventID] {
				mismatched[rec.EventID] = true
				r.PayloadMismatches++
				list(&r.MismatchIDs, rec.EventID)
			}
			continue
		}
		events[rec.EventID] = rec
		if rec.claim == "" {
			continue
		}
		k := rec.Topic + "\x00" + rec.claim
		if other, ok := claims[k]; ok {
			r.ClaimDuplicates++
			list(&r.ClaimIDs, rec.EventID+" (as "+other+")")
			continue
		}
		claims[k] = rec.EventID
	}
	r.Events = len(events)

	// One notification per claim: rows are unique per event ID, so a
	// doubled effect shows up as two event IDs for one claim.
	byClaim := map[string][]string{}
	for id, n := range notes {
		if n.claim != "" {
			k := n.topic + "\x00" + n.claim
			byClaim[k] = append(byClaim[k], id)
		}
	}
	for _, ids := range byClaim {
		if len(ids) > 1 {
			slices.Sort(ids)
			r.DuplicateEffects += len(ids) - 1
			list(&r.DuplicateIDs, strings.Join(ids, "="))
		}
	}
	slices.Sort(r.DuplicateIDs)

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
		if next, ok := ts.committed[ev.Topic][ev.Partition]; !ok || next < 0 || ev.Offset >= next {
			r.NotYetConsumed++
			continue
		}
		unaccounted = append(unaccounted, id)
	}
	inRetry := map[string]bool{}
	if len(unaccounted) > 0 && running != nil {
		inRetry = running(unaccounted)
	}
	slices.Sort(unaccounted)
	for _, id := range unaccounted {
		if inRetry[id] {
			r.InRetry++
			continue
		}
		r.Lost++
		list(&r.LostIDs, id)
	}
	var orphans []string
	for id, n := range notes {
		if _, ok := events[id]; ok {
			continue
		}
		if oldest, ok := ts.oldest[n.topic][n.partition]; ok && n.offset < oldest {
			r.Expired++
			continue
		}
		orphans = append(orphans, id)
	}
	slices.Sort(orphans)
	r.Orphans = len(orphans)
	for _, id := range orphans {
		list(&r.OrphanIDs, id)
	}
	plain := make(map[string]workflows.ConsumedEvent, len(events))
	for id, ev := range events {
		plain[id] = ev.ConsumedEvent
	}
	r.Late, r.LateInline = lateDeliveries(plain, notes)
	if withLedger {
		l := notifysim.Summarize(ledger)
		r.Webhook = &l
	}
	return r
}

// readTopicRecords reads every record of topics, from the oldest kept to
// the end as it was when the call began. It keeps a digest of each value
// rather than the value, so a large topic fits in memory.
func readTopicRecords(ctx context.Context, cfg kafka.Config, topics []string) (topicState, []string, error) {
	cfg.ClientID = cmp.Or(cfg.ClientID, "claimflow-audit")
	parts, missing, err := kafka.ScanTopics(ctx, cfg, topics, func(m *sarama.ConsumerMessage) topicRecord {
		return newTopicRecord(kafka.ParseEvent(m), m.Value)
	})
	ts := topicState{oldest: map[string]map[int32]int64{}}
	for _, p := range parts {
		if ts.oldest[p.Topic] == nil {
			ts.oldest[p.Topic] = map[int32]int64{}
		}
		ts.oldest[p.Topic][p.Partition] = p.Oldest
		ts.records = append(ts.records, p.Records...)
	}
	return ts, missing, err
}

// newTopicRecord keeps what the audit needs of a record and drops its value.
func newTopicRecord(ev workflows.ConsumedEvent, value []byte) topicRecord {
	rec := topicRecord{ConsumedEvent: ev, digest: sha256.Sum256(value)}
	rec.Value = ""
	if rec.Malformed == "" {
		rec.claim = ClaimOf(rec.EventType, value)
	}
	return rec
}

// ClaimOf names what an event says happened to whom: its type and its data
// in a canonical form (keys sorted). occurred_at is left out, so two events
// that differ only in when they were built are one claim. "" when the value
// has no data to tell.
func ClaimOf(eventType string, value []byte) string {
	var env struct {
		Data map[string]any `json:"data"`
	}
	if err := json.Unmarshal(value, &env); err != nil || len(env.Data) == 0 {
		return ""
	}
	b, err := json.Marshal(env.Data)
	if err != nil {
		return ""
	}
	return eventType + " " + string(b)
}

func loadNotifications(ctx context.Context, db *pgxpool.Pool, topics []string) (map[string]delivered, error) {
	rows, err := store.ListNotifications(ctx, db, topics)
	if err != nil {
		return nil, err
	}
	out := make(map[string]delivered, len(rows))
	for _, n := range rows {
		out[n.EventID] = delivered{topic: n.Topic, partition: n.Partition, offset: n.Offset, key: n.Key, path: n.Path,
			seq: n.Seq, claim: ClaimOf(n.EventType, []byte(n.Payload))}
	}
	return out, nil
}

// loadConsumeDeadLetters returns the status of each consumed event that was
// dead-lettered.
func loadConsumeDeadLetters(ctx context.Context, db *pgxpool.Pool, topics []string) (map[string]string, error) {
	return store.ConsumeDeadLetterStatus(ctx, db, topics)
}

// WebhookLedger reads the deliveries of topics from a receiver that keeps a
// ledger of them (the simulator's GET /admin/deliveries).
func WebhookLedger(base string) func(ctx context.Context, topics []string) ([]notifysim.Delivery, error) {
	return func(ctx context.Context, topics []string) ([]notifysim.Delivery, error) {
		var all []notifysim.Delivery
		for _, topic := range topics {
			req, err := http.NewRequestWithContext(ctx, http.MethodGet,
				strings.TrimRight(base, "/")+"/admin/deliveries?topic="+url.QueryEscape(topic), nil)
			if err != nil {
				return nil, err
			}
			resp, err := http.DefaultClient.Do(req)
			if err != nil {
				return nil, err
			}
			var rep notifysim.LedgerReport
			err = json.NewDecoder(resp.Body).Decode(&rep)
			resp.Body.Close()
			if resp.StatusCode != http.StatusOK {
				return nil, fmt.Errorf("GET %s answered %s", req.URL, resp.Status)
			}
			if err != nil {
				return nil, fmt.Errorf("decode the ledger of %s: %w", topic, err)
			}
			all = append(all, rep.Deliveries...)
		}
		return all, nil
	}
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
			resp, err := tc.DescribeWorkflow(ctx, workflows.DeliverEventWorkflowID(id), "")
			if err != nil {
				return
			}
			if resp.RawResponse.GetWorkflowExecutionInfo().GetStatus() == enumspb.WORKFLOW_EXECUTION_STATUS_RUNNING {
				mu.Lock()
				out[id] = true
				mu.Unlock()
			}
		})
	}
	wg.Wait()
	return out
}

// WriteText prints r for a person.
func (r Report) WriteText(w io.Writer) {
	fmt.Fprintf(w, "audit of %s (group %s) against the notifications table, in %s\n", strings.Join(r.Topics, ", "), r.Group, r.Took)
	if len(r.MissingTopics) > 0 {
		fmt.Fprintf(w, "  topics that do not exist:     %s\n", strings.Join(r.MissingTopics, ", "))
	}
	fmt.Fprintf(w, "  records on the topics         %d (%d distinct event IDs)\n", r.Records, r.Events)
	fmt.Fprintf(w, "  redelivered copies            %d (same event_id and payload: at-least-once, deduped)\n", r.Redelivered)
	fmt.Fprintf(w, "  copies with another payload   %d\n", r.PayloadMismatches)
	fmt.Fprintf(w, "  one claim under two event IDs %d (on the topics)\n", r.ClaimDuplicates)
	fmt.Fprintf(w, "  delivered                     %d (%d through the retry path)\n", r.Delivered, r.ViaWorkflow)
	fmt.Fprintf(w, "  lost                          %d\n", r.Lost)
	fmt.Fprintf(w, "  duplicate effects             %d (notifications beyond the first of one claim)\n", r.DuplicateEffects)
	fmt.Fprintf(w, "  notifications without event  %d (%d more whose event the topic no longer keeps)\n", r.Orphans, r.Expired)
	fmt.Fprintf(w, "  in retry                      %d\n", r.InRetry)
	fmt.Fprintf(w, "  dead-lettered (open)          %d\n", r.DeadLettered)
	fmt.Fprintf(w, "  discarded by an operator      %d\n", r.Discarded)
	fmt.Fprintf(w, "  not yet consumed              %d\n", r.NotYetConsumed)
	fmt.Fprintf(w, "  delivered after a later event of their key: %d (inline: %d)\n", r.Late, r.LateInline)
	if l := r.Webhook; l != nil {
		fmt.Fprintf(w, "  webhook: %d keys, %d attempts, %d effects, %d re-sent after acceptance, %d retried after a refusal; "+
			"%d keys took effect twice, %d changed body\n",
			l.Keys, l.Attempts, l.Effects, l.Resent, l.Retried, len(l.DoubleEffects), len(l.BodyChanged))
	}
	if rr := r.Reservations; rr != nil {
		fmt.Fprint(w, "  ")
		rr.WriteText(w)
	}
	if wl := r.Waitlist; wl != nil {
		fmt.Fprintf(w, "  waitlists: %d courses, %d waiting, %d promoted; free seats while waiting %d, oversold %d, "+
			"counters off %d, promoted twice %d, out of order %d, waitlisted and enrolled %d\n",
			wl.Courses, wl.Waiting, wl.Promotions, len(wl.FreeSeatsWhileWaiting), len(wl.Oversold),
			len(wl.CounterMismatches), wl.DoublePromotions, wl.OutOfOrder, wl.WaitlistedAndEnrolled)
	}
	for _, x := range []struct {
		what string
		ids  []string
	}{
		{"lost", r.LostIDs}, {"duplicate effects", r.DuplicateIDs}, {"copies with another payload", r.MismatchIDs},
		{"one claim under two event IDs", r.ClaimIDs}, {"notifications without event", r.OrphanIDs},
	} {
		if len(x.ids) > 0 {
			fmt.Fprintf(w, "  %s, first ones: %s\n", x.what, strings.Join(x.ids, " "))
		}
	}
	if l := r.Webhook; l != nil && !l.OK() {
		fmt.Fprintf(w, "  webhook keys that took effect twice: %s; changed body: %s\n",
			strings.Join(firstN(l.DoubleEffects, 20), " "), strings.Join(firstN(l.BodyChanged, 20), " "))
	}
	if r.OK() {
		fmt.Fprintln(w, "OK: no event lost, no effect twice, copies identical, inline deliveries in key order")
	} else {
		fmt.Fprintln(w, "FAILED: see lost, duplicate effects, payloads, notifications without event, webhook, inline order and waitlists above")
	}
}

func firstN(ids []string, n int) []string { return ids[:min(len(ids), n)] }

// ErrFailed is returned by callers that turn a report that is not OK into
// an exit status.
var ErrFailed = errors.New("audit found a lost event, a duplicate effect, differing copies, a notification without event or reordered notifications")

// Copy is one record of a topic as the audit compares it: its event, a
// digest of its value (copies of one event must share it) and its claim,
// the event type and data in canonical form (one effect per claim).
type Copy struct {
	workflows.ConsumedEvent
	Digest [sha256.Size]byte
	Claim  string
}

// ReadCopies reads every record of topics with the audit's reader, for
// tests that check the guarantee on part of a topic; missing lists the
// topics that do not exist.
func ReadCopies(ctx context.Context, kcfg kafka.Config, topics []string) (copies []Copy, missing []string, err error) {
	ts, missing, err := readTopicRecords(ctx, kcfg, topics)
	if err != nil {
		return nil, missing, err
	}
	copies = make([]Copy, len(ts.records))
	for i, r := range ts.records {
		copies[i] = Copy{ConsumedEvent: r.ConsumedEvent, Digest: r.digest, Claim: r.claim}
	}
	return copies, missing, nil
}
