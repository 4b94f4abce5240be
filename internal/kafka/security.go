package kafka

import (
	"crypto/x509"
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"strings"
	"sync/atomic"
	"syscall"

	"github.com/IBM/sarama"
	"github.com/xdg-go/scram"
)

// applySecurity turns on TLS and SASL in sc as cfg says.
func applySecurity(sc *sarama.Config, cfg Config) error {
	tc, err := cfg.TLS.Config()
	if err != nil {
		return err
	}
	if tc != nil {
		// sarama fills in the broker's host as ServerName when it is empty.
		sc.Net.TLS.Enable, sc.Net.TLS.Config = true, tc
	}
	s := cfg.SASL
	if s.Mechanism == "" {
		return nil
	}
	sc.Net.SASL.Enable = true
	sc.Net.SASL.Handshake = true
	// v1: SaslAuthenticate requests, so a refusal comes back as an error
	// code (SASL_AUTHENTICATION_FAILED) rather than a closed connection.
	sc.Net.SASL.Version = sarama.SASLHandshakeV1
	switch s.Mechanism {
	case SASLPlain:
		sc.Net.SASL.Mechanism = sarama.SASLTypePlaintext
		sc.Net.SASL.User, sc.Net.SASL.Password = s.User, s.Password
	case SASLScram256, SASLScram512:
		hash, mech := scram.SHA256, sarama.SASLMechanism(sarama.SASLTypeSCRAMSHA256)
		if s.Mechanism == SASLScram512 {
			hash, mech = scram.SHA512, sarama.SASLTypeSCRAMSHA512
		}
		sc.Net.SASL.Mechanism = mech
		sc.Net.SASL.User, sc.Net.SASL.Password = s.User, s.Password
		w := &scramWatch{}
		sc.Net.SASL.SCRAMClientGeneratorFunc = func() sarama.SCRAMClient { return &scramClient{hash: hash, watch: w} }
	case SASLOAuthBearer:
		sc.Net.SASL.Mechanism = sarama.SASLTypeOAuth
		sc.Net.SASL.TokenProvider = s.Tokens
		if s.Tokens == nil {
			if s.TokenFile == "" {
				return errors.New("KAFKA_SASL_MECHANISM=OAUTHBEARER needs KAFKA_SASL_OAUTHBEARER_TOKEN_PATH or a token source")
			}
			sc.Net.SASL.TokenProvider = FileTokens(s.TokenFile)
		}
	default:
		return fmt.Errorf("KAFKA_SASL_MECHANISM must be %s, %s, %s or %s, got %q",
			SASLPlain, SASLScram256, SASLScram512, SASLOAuthBearer, s.Mechanism)
	}
	return nil
}

// FileTokens is an OAUTHBEARER token source that reads path on every call:
// whatever rewrites the file (a sidecar, a Vault or workload-identity
// agent) keeps the token current, and each new connection sends the token
// the file holds then.
func FileTokens(path string) sarama.AccessTokenProvider { return fileTokens(path) }

type fileTokens string

func (f fileTokens) Token() (*sarama.AccessToken, error) {
	b, err := os.ReadFile(string(f))
	if err != nil {
		return nil, fmt.Errorf("KAFKA_SASL_OAUTHBEARER_TOKEN_PATH: %w", err)
	}
	tok := strings.TrimSpace(string(b))
	if tok == "" {
		return nil, fmt.Errorf("KAFKA_SASL_OAUTHBEARER_TOKEN_PATH: %s is empty", string(f))
	}
	return &sarama.AccessToken{Token: tok}, nil
}

// scramClient is sarama's SCRAM client on github.com/xdg-go/scram. Its
// watch counts the exchanges of one configuration that are still open: a
// broker that refuses the credentials by closing the connection (kfake
// does) leaves one open, which Explain reads as a refusal.
type scramClient struct {
	hash  scram.HashGeneratorFcn
	watch *scramWatch
	conv  *scram.ClientConversation
	open  bool
}

type scramWatch struct{ open atomic.Int64 }

// errSCRAMFinal marks a server-final message that refused the proof or
// could not prove the server knows the password.
var errSCRAMFinal = errors.New("SCRAM exchange failed at the server's final message")

func (c *scramClient) Begin(user, password, authzID string) error {
	cl, err := c.hash.NewClient(user, password, authzID)
	if err != nil {
		return err
	}
	c.conv = cl.NewConversation()
	return nil
}

func (c *scramClient) Step(challenge string) (string, error) {
	final := c.open // the client-first message went out: this is past it
	resp, err := c.conv.Step(challenge)
	switch {
	case err != nil:
		c.close()
		if final && c.conv.Done() {
			return "", fmt.Errorf("%w: %v", errSCRAMFinal, err)
		}
		return "", err
	case !c.open:
		c.open = true
		c.watch.open.Add(1)
	case c.conv.Done():
		c.close()
	}
	return resp, nil
}

func (c *scramClient) close() {
	if c.open {
		c.open = false
		c.watch.open.Add(-1)
	}
}

func (c *scramClient) Done() bool { return c.conv.Done() }

// AuthError is a connection that failed on its security settings: Kafka
// refused the SASL credentials, or the TLS handshake failed. Retrying with
// the same settings cannot succeed, so startup gives up at once with
// Reason, which names the variable to check and never a secret.
type AuthError struct {
	Reason string
	Err    error
}

func (e *AuthError) Error() string { return e.Reason + " (" + e.Err.Error() + ")" }
func (e *AuthError) Unwrap() error { return e.Err }

// IsAuthError reports whether err is (or wraps) an AuthError.
func IsAuthError(err error) bool {
	var a *AuthError
	return errors.As(err, &a)
}

// Explain returns err as an *AuthError when a client of cfg failed on its
// TLS or SASL settings, and err unchanged otherwise (a broker that is down,
// a timeout). sc, the client's configuration from SaramaConfig, lets it
// also read a SCRAM exchange the broker cut short as a refusal (kfake
// closes the connection instead of answering): pass it only with the
// error of a client's construction, when no other exchange of sc can be
// under way, and nil otherwise.
func Explain(cfg Config, sc *sarama.Config, err error) error {
	if err == nil || IsAuthError(err) {
		return err
	}
	if reason := authReason(cfg, sc, err); reason != "" {
		return &AuthError{Reason: reason, Err: err}
	}
	// sarama drops a broker that answers the SASL handshake with an error
	// code (a mechanism it does not offer) without saying why: one
	// connection of its own finds the answer.
	if sc != nil && sc.Net.SASL.Enable && err.Error() == sarama.ErrOutOfBrokers.Error() {
		if perr := handshake(cfg, sc); perr != nil {
			if reason := authReason(cfg, nil, perr); reason != "" {
				return &AuthError{Reason: reason, Err: fmt.Errorf("%w: %w", err, perr)}
			}
		}
	}
	return err
}

// handshake opens one connection to each broker in turn with sc until one
// fails, and returns that failure.
func handshake(cfg Config, sc *sarama.Config) error {
	for _, addr := range cfg.Brokers {
		b := sarama.NewBroker(addr)
		if err := b.Open(sc); err != nil {
			continue
		}
		_, err := b.Connected()
		_ = b.Close()
		if err != nil {
			return err
		}
	}
	return nil
}

func authReason(cfg Config, sc *sarama.Config, err error) string {
	s := cfg.SASL
	credentials := fmt.Sprintf("Kafka refused the SASL credentials of KAFKA_SASL_USERNAME=%s (KAFKA_SASL_MECHANISM=%s): check KAFKA_SASL_PASSWORD", s.User, s.Mechanism)
	if s.Mechanism == SASLOAuthBearer {
		credentials = "Kafka refused the OAUTHBEARER token"
		if s.Tokens == nil {
			credentials += " in KAFKA_SASL_OAUTHBEARER_TOKEN_PATH=" + s.TokenFile
		}
		credentials += ": check that it is current and meant for this cluster"
	}
	tlsVars := cfg.TLS.Vars
	caVar := or(tlsVars.CA, "KAFKA_TLS_CA_PATH")
	var (
		unknownCA x509.UnknownAuthorityError
		hostname  x509.HostnameError
		invalid   x509.CertificateInvalidError
		opErr     *net.OpError
	)
	switch {
	case errors.Is(err, sarama.ErrSASLAuthenticationFailed), errors.Is(err, errSCRAMFinal):
		return credentials
	case errors.Is(err, sarama.ErrUnsupportedSASLMechanism):
		return fmt.Sprintf("Kafka at %s does not offer KAFKA_SASL_MECHANISM=%s on this listener: check its sasl.enabled.mechanisms", strings.Join(cfg.Brokers, ","), s.Mechanism)
	case errors.Is(err, sarama.ErrIllegalSASLState) && s.Mechanism != "":
		return fmt.Sprintf("Kafka at %s does not take SASL on this listener: point KAFKA_BROKERS at its SASL listener or unset KAFKA_SASL_MECHANISM", strings.Join(cfg.Brokers, ","))
	case errors.As(err, &unknownCA):
		if cfg.TLS.CA == "" {
			return fmt.Sprintf("Kafka's TLS certificate is not signed by a CA this machine trusts: set %s to the CA that signs the brokers", caVar)
		}
		return fmt.Sprintf("Kafka's TLS certificate is not signed by the CA in %s=%s", caVar, cfg.TLS.CA)
	case errors.As(err, &hostname):
		return fmt.Sprintf("Kafka's TLS certificate is not valid for %q: set %s to a name it holds, or fix KAFKA_BROKERS", hostname.Host, or(tlsVars.ServerName, "KAFKA_TLS_SERVER_NAME"))
	case errors.As(err, &invalid):
		return fmt.Sprintf("Kafka's TLS certificate is not valid: %v", invalid)
	case errors.As(err, &opErr) && opErr.Op == "remote error" && cfg.TLS.Enabled:
		// A TLS alert from the broker: it refused the handshake, most often
		// for want of a client certificate it trusts.
		return fmt.Sprintf("Kafka refused the TLS handshake: check %s and %s (a client certificate the brokers trust)",
			or(tlsVars.Cert, "KAFKA_TLS_CERT_PATH"), or(tlsVars.Key, "KAFKA_TLS_KEY_PATH"))
	case openSCRAM(sc) && (errors.Is(err, io.EOF) || errors.Is(err, io.ErrUnexpectedEOF) || errors.Is(err, syscall.ECONNRESET)):
		// The broker closed the connection in the middle of the exchange
		// instead of answering it.
		return credentials
	}
	return ""
}

// openSCRAM reports whether a SCRAM exchange of sc began and never ended.
func openSCRAM(sc *sarama.Config) bool {
	if sc == nil || sc.Net.SASL.SCRAMClientGeneratorFunc == nil {
		return false
	}
	c, ok := sc.Net.SASL.SCRAMClientGeneratorFunc().(*scramClient)
	return ok && c.watch.open.Load() > 0
}

func or(s, def string) string {
	if s != "" {
		return s
	}
	return def
}
