package workflows

import (
	"time"

	"go.temporal.io/sdk/workflow"
)

// Coupons: a vendor publishes coupon types, each with a fixed stock; users
// are issued coupons while stock lasts (IssueCoupon) and use them, which pays
// the vendor (UseCoupon). Both follow the enrollment saga's conventions.

// Topic names for coupon events; messages are keyed by coupon type ID, so
// the events of one type stay in order.
const (
	CouponTopic    = "coupon.events"
	CouponDLTTopic = CouponTopic + ".DLT"
)

// Event types on CouponTopic.
const (
	EventCouponIssued    = "coupon.issued"
	EventCouponRevoked   = "coupon.revoked"
	EventCouponUsed      = "coupon.used"
	EventCouponUseFailed = "coupon.use_failed"
)

// IssueCouponWorkflowID: one issue run per user and coupon type, so
// concurrent claims of one user meet in one run.
func IssueCouponWorkflowID(typeID, userID string) string {
	return "coupon-issue:" + typeID + ":" + userID
}

// UseCouponWorkflowID: every request to use one coupon meets in one run.
func UseCouponWorkflowID(couponID string) string {
	return "coupon-use:" + couponID
}

// PayoutKey is the idempotency key of one use of a coupon. It is the
// Idempotency-Key header of every call to the vendor's payout API for that
// use (so a retried call cannot pay twice), the ledger's unique key, and the
// subject of the use's event IDs.
func PayoutKey(couponID, useID string) string {
	return couponID + "/use/" + useID
}

// CouponStatus is the state of a coupon (stored in Postgres: issued, using,
// used, revoked) and of the run handling it (mirrored into ClaimStatus).
type CouponStatus string

const (
	CouponPending CouponStatus = "pending"
	// CouponIssued: the user holds the coupon, unused.
	CouponIssued CouponStatus = "issued"
	// CouponUsing: a use holds the coupon while the vendor is paid.
	CouponUsing CouponStatus = "using"
	// CouponUsed: the vendor is paid; final.
	CouponUsed CouponStatus = "used"
	// CouponRevoked: an operator compensated its issue; the stock is back.
	CouponRevoked      CouponStatus = "revoked"
	CouponDeadLettered CouponStatus = "dead_lettered"
	// CouponRefused: a business refusal answered the request.
	CouponRefused CouponStatus = "refused"
	// CouponFailed: the run ended without a decision (cancelled).
	CouponFailed CouponStatus = "failed"
)

// ErrorTypePayoutUnavailable is the (retryable) error type PayVendor returns
// when the payout API answers 5xx, 408, 409 or 429.
const ErrorTypePayoutUnavailable = "payout_unavailable"

// IssueCouponInput claims one coupon of a type for a user. CouponID is chosen
// by the caller, so it survives a reset of the run, and makes a retried
// reservation a no-op.
type IssueCouponInput struct {
	CouponID    string
	TypeID      string
	UserID      string
	RequestedAt time.Time
	// StarterUpdateID is the ID of the decision update of the request that
	// starts the run, and AnswerWait how long that request waits for its
	// answer (the API's decision wait): the run answers that update as the
	// claim itself and stays open for it that long (claim.expectStarter).
	// Empty for a run started without a waiting request.
	StarterUpdateID string        `json:",omitempty"`
	AnswerWait      time.Duration `json:",omitempty"`
}

// UseRequest is one request to use a coupon: the run's input carries the one
// that started the run, and every request (that one too) sends its own with
// the decision update. UseID is the request's ID; when the request starts a
// use attempt, the attempt pays with PayoutKey(coupon, UseID).
type UseRequest struct {
	UseID       string
	UserID      string
	OrderID     string `json:",omitempty"`
	RequestedAt time.Time
}

type UseCouponInput struct {
	CouponID string
	Request  UseRequest
	// PayoutTimeout is the PAYOUT_TIMEOUT the API runs with; the payout's
	// attempt timeout derives from it (PayoutAttemptTimeout), and so does
	// the API's wait for the decision (DecisionDeadline), from the same
	// value. Zero means MaxPayoutTimeout.
	PayoutTimeout time.Duration `json:",omitempty"`
	// AnswerWait is how long the request that started the run waits for its
	// answer (the API's decision wait). Should that request's update reach
	// the run late, the run stays open for it this long (UseCoupon). Zero
	// means DecisionDeadline of the use.
	AnswerWait time.Duration `json:",omitempty"`
}

// Payout is a recorded payment of a vendor for one use of a coupon.
type Payout struct {
	LedgerID         int64
	IdempotencyKey   string
	VendorID         string
	AmountCents      int64
	ProviderPayoutID string
	RecordedAt       time.Time
}

// CouponDecision answers an issue or use request. Status is issued or used
// on success, refused with Refusal otherwise (a compensated use is refused
// with payout_declined or payout_failed), failed when the run ended
// undecided. For already_issued, CouponID names the coupon the user holds.
type CouponDecision struct {
	CouponID string
	UseID    string `json:",omitempty"`
	Status   CouponStatus
	Refusal  Refusal `json:",omitempty"`
	Message  string  `json:",omitempty"`
	Payout   *Payout `json:",omitempty"`
}

// CouponState is what the status query of a coupon run returns.
type CouponState struct {
	CouponID     string
	CouponTypeID string `json:",omitempty"`
	VendorID     string `json:",omitempty"`
	UserID       string
	Status       CouponStatus
	Refusal      Refusal `json:",omitempty"`
	// UseID is the current (or last) use attempt of a UseCoupon run.
	UseID string `json:",omitempty"`
	// Attempts counts the use attempts a UseCoupon run made.
	Attempts     int     `json:",omitempty"`
	Payout       *Payout `json:",omitempty"`
	DeadLetterID int64   `json:",omitempty"`
	LastError    string  `json:",omitempty"`
}

// ---- activity inputs and results ----

// ReserveCouponInput takes one unit of stock and records the coupon in one
// transaction.
type ReserveCouponInput struct {
	CouponID    string
	TypeID      string
	UserID      string
	WorkflowID  string
	RunID       string
	RequestedAt time.Time
}

type ReserveCouponResult struct {
	VendorID string
	IssuedAt time.Time
}

// RevokeCouponInput takes an unused coupon back and returns its stock.
type RevokeCouponInput struct {
	CouponID string
}

// RevokeCouponResult: Revoked is false when the coupon could not be taken
// back (it is being used or used) or never existed.
type RevokeCouponResult struct {
	Revoked bool
}

// MarkCouponUsedInput holds a coupon for one use attempt: the coupon must be
// issued and owned by UserID.
type MarkCouponUsedInput struct {
	CouponID   string
	UserID     string
	UseID      string
	OrderID    string
	WorkflowID string
	RunID      string
}

type MarkCouponUsedResult struct {
	TypeID      string
	VendorID    string
	AmountCents int64
}

// UnmarkCouponUsedInput is the compensation of MarkCouponUsed: the coupon
// goes back to issued if (and only if) this use attempt still holds it.
type UnmarkCouponUsedInput struct {
	CouponID string
	UseID    string
}

// PayVendorInput is one payout through the vendor's payout API.
type PayVendorInput struct {
	IdempotencyKey string
	CouponID       string
	UseID          string
	VendorID       string
	AmountCents    int64
	OrderID        string `json:",omitempty"`
}

type PayVendorResult struct {
	ProviderPayoutID string
}

// RecordPayoutInput records a payout in the ledger, credits the vendor's
// balance and marks the coupon used, in one transaction keyed on
// IdempotencyKey.
type RecordPayoutInput struct {
	IdempotencyKey   string
	CouponID         string
	UseID            string
	VendorID         string
	AmountCents      int64
	ProviderPayoutID string
	OrderID          string `json:",omitempty"`
	WorkflowID       string
	RunID            string
}

type RecordPayoutResult struct {
	LedgerID   int64
	RecordedAt time.Time
}

// ---- shared by IssueCoupon and UseCoupon ----

// couponStatusSetter keeps a coupon run's status and its ClaimStatus search
// attribute in step; a refusal shows as its code.
func couponStatusSetter(state *CouponState) func(workflow.Context, CouponStatus) {
	return func(ctx workflow.Context, s CouponStatus) {
		state.Status = s
		claim := string(s)
		if s == CouponRefused {
			claim = string(state.Refusal)
		}
		upsertClaimStatus(ctx, claim)
	}
}

func upsertCouponAttributes(ctx workflow.Context, typeID, vendorID string) {
	if err := workflow.UpsertTypedSearchAttributes(ctx,
		SearchCouponTypeID.ValueSet(typeID), SearchVendorID.ValueSet(vendorID)); err != nil {
		workflow.GetLogger(ctx).Warn("upsert search attributes failed", "error", err)
	}
}

// parkingFor lets publishOrPark park a coupon run's message: the run shows
// dead_lettered, and the status it had once the message is out.
func parkingFor(state *CouponState, setStatus func(workflow.Context, CouponStatus)) parking {
	before := state.Status
	return parking{
		deadLetterID: &state.DeadLetterID,
		lastError:    &state.LastError,
		park:         func(ctx workflow.Context) { setStatus(ctx, CouponDeadLettered) },
		unpark:       func(ctx workflow.Context) { setStatus(ctx, before) },
	}
}

func couponUndecided(couponID string, err error) CouponDecision {
	return CouponDecision{CouponID: couponID, Status: CouponFailed, Message: undecidedMessage(err)}
}
