package config

import (
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"strings"
)

// EventKeyFile is where the local stack keeps its event signing key.
const EventKeyFile = "event-signing-key"

// minEventKeyBytes is the shortest EVENT_SIGNING_KEY taken: HMAC-SHA256's
// block of entropy.
const minEventKeyBytes = 32

// loadEvents reads the key the workers sign events with and the consumers
// verify them with. Unset, `claimflow worker` and `claimflow consumer`
// refuse to start (RequireEventKey); the dev stack makes one.
func loadEvents(e env, c *Config) error {
	c.EventSigningKey = e.get("EVENT_SIGNING_KEY")
	if c.EventSigningKey != "" && len(c.EventSigningKey) < minEventKeyBytes {
		return fmt.Errorf("EVENT_SIGNING_KEY must be at least %d bytes, got %d", minEventKeyBytes, len(c.EventSigningKey))
	}
	return nil
}

// RequireEventKey is the check of the processes that sign or verify events.
func (c Config) RequireEventKey(process string) error {
	if c.EventSigningKey == "" {
		return fmt.Errorf("%s needs EVENT_SIGNING_KEY (at least %d bytes, shared by workers and consumers): events are signed by the workers and verified by the consumers", process, minEventKeyBytes)
	}
	return nil
}

// EnsureStackEventKey gives the local stack an event signing key:
// EVENT_SIGNING_KEY if set, else the one in <dataDir>/event-signing-key,
// generated on first run.
func EnsureStackEventKey(c *Config, dataDir string) error {
	if c.EventSigningKey != "" {
		return nil
	}
	path := filepath.Join(dataDir, EventKeyFile)
	b, err := os.ReadFile(path)
	if errors.Is(err, fs.ErrNotExist) {
		buf := make([]byte, 32)
		if _, err := rand.Read(buf); err != nil {
			return err
		}
		b = []byte(hex.EncodeToString(buf))
		if err := os.WriteFile(path, append(b, '\n'), 0o600); err != nil {
			return fmt.Errorf("write the event signing key: %w", err)
		}
	} else if err != nil {
		return err
	}
	key := strings.TrimSpace(string(b))
	if len(key) < minEventKeyBytes {
		return fmt.Errorf("%s holds a key shorter than %d bytes", path, minEventKeyBytes)
	}
	c.EventSigningKey = key
	return nil
}
