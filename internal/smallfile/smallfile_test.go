package smallfile

import (
	"errors"
	"io/fs"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

func TestRead(t *testing.T) {
	dir := t.TempDir()
	write := func(name, content string) string {
		p := filepath.Join(dir, name)
		if err := os.WriteFile(p, []byte(content), 0o600); err != nil {
			t.Fatal(err)
		}
		return p
	}
	exact, over := write("exact", "12345678"), write("over", "123456789")
	if b, err := Read(exact, 8, nil); err != nil || string(b) != "12345678" {
		t.Errorf("a file of the limit: %q, %v", b, err)
	}
	if _, err := Read(over, 8, nil); err == nil || !strings.Contains(err.Error(), over+": longer than 8 bytes") {
		t.Errorf("a file past the limit: %v", err)
	}
	if _, err := Read(dir, 8, nil); err == nil || !strings.Contains(err.Error(), "not a regular file") {
		t.Errorf("a directory: %v", err)
	}
	if _, err := Read(filepath.Join(dir, "none"), 8, nil); !errors.Is(err, fs.ErrNotExist) {
		t.Errorf("a missing file: %v", err)
	}
	refused := errors.New("refused")
	var saw fs.FileInfo
	_, err := Read(exact, 8, func(f *os.File, fi fs.FileInfo) error {
		saw = fi
		return refused
	})
	if err != refused || saw == nil || saw.Size() != 8 {
		t.Errorf("check: %v, saw %v", err, saw)
	}
}
