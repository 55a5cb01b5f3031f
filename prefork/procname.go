package prefork

import (
	"bytes"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"
)

// Worker processes are named after their supervisor, so that `ps -C NAME`
// and `pgrep -x NAME` find the whole tree, and titled, so that ps tells
// them apart:
//
//	PID  COMMAND
//	100  preforkd run -config /etc/preforkd/preforkd.toml
//	101  preforkd: worker 0 (generation 0)
//
// A worker is executed through the supervisor's descriptor of the
// program's file (/proc/PID/fd/N), which the kernel would name after that
// descriptor's number. The supervisor passes its own name (its /proc/self/comm: for the
// daemon "preforkd", for an embedding program that program's name) in
// envName, and the worker's title as argv[0]; the rest of argv is the
// supervisor's, untouched, since the program parses it again before Run.

// processName is the supervisor's own name, as ps shows it; "" if unknown.
func processName() string {
	if b, err := os.ReadFile("/proc/self/comm"); err == nil {
		if name := strings.TrimSpace(string(b)); name != "" {
			return name
		}
	}
	if len(os.Args) > 0 {
		return filepath.Base(os.Args[0])
	}
	return ""
}

// workerTitle is a worker's command line as ps shows it.
func workerTitle(name string, index, gen int) string {
	return fmt.Sprintf("%s: worker %d (generation %d)", name, index, gen)
}

// nameWorker gives this worker process its supervisor's name (every
// thread's comm: ps -C, pgrep -x and top -H read it) and makes its command
// line read as its title, argv[0] alone.
//
// The title is argv[0] already. The arguments after it stay where they
// are (os.Args and every flag value parsed from it point into that memory);
// only the NUL that ends the last one is overwritten, through /proc/self/mem.
// When the byte at the end of the argument area is not NUL, the kernel
// shows the command line as the string at its start, up to its first NUL:
// the title (the convention of setproctitle(3); the Go strings do not
// include that NUL and do not change).
func nameWorker(name string) error {
	var errs []error
	if name != "" {
		// A thread's name is 15 bytes at most; the kernel truncates.
		tasks, err := os.ReadDir("/proc/self/task")
		if err != nil {
			errs = append(errs, err)
		}
		for _, task := range tasks {
			// A thread that exited meanwhile is no error worth reporting.
			if err := os.WriteFile("/proc/self/task/"+task.Name()+"/comm", []byte(name), 0); err != nil && !errors.Is(err, os.ErrNotExist) {
				errs = append(errs, err)
			}
		}
	}
	if len(os.Args) > 1 {
		errs = append(errs, hideArguments())
	}
	if err := errors.Join(errs...); err != nil {
		return fmt.Errorf("prefork: naming the worker: %w", err)
	}
	return nil
}

// hideArguments overwrites the NUL at the end of this process's argument
// area (see nameWorker).
func hideArguments() error {
	stat, err := os.ReadFile("/proc/self/stat")
	if err != nil {
		return err
	}
	// pid (comm) state ...: comm may contain spaces and parentheses.
	i := bytes.LastIndexByte(stat, ')')
	if i < 0 {
		return errors.New("/proc/self/stat: no command name")
	}
	f := strings.Fields(string(stat[i+1:]))
	const argEndField = 49 // proc(5), counting from 1; f[0] is field 3
	if len(f) <= argEndField-3 {
		return errors.New("/proc/self/stat: no arg_end field")
	}
	end, err := strconv.ParseInt(f[argEndField-3], 10, 64)
	if err != nil || end <= 0 {
		return fmt.Errorf("/proc/self/stat: arg_end %q", f[argEndField-3])
	}
	mem, err := os.OpenFile("/proc/self/mem", os.O_RDWR, 0)
	if err != nil {
		return err
	}
	defer mem.Close()
	var last [1]byte
	if _, err := mem.ReadAt(last[:], end-1); err != nil {
		return err
	}
	if last[0] != 0 {
		return nil // done already, or a layout this code does not know
	}
	_, err = mem.WriteAt([]byte{' '}, end-1)
	return err
}
