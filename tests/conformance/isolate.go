package main

// Plays in network namespaces of their own (and, for a TLS scenario, mount
// namespaces: tls.go). Both proxies listen on
// Knative's fixed ports, so on one network two plays cannot overlap; each
// in a namespace of its own (a child process of this runner, cloned with
// CLONE_NEWNET, with only its loopback up), the plays of a scenario (two
// proxies in each of two generations) run at once. Most of a long
// scenario is waiting (a drain is 30 s whoever drains), so this is what
// keeps a full run short. It needs root (CAP_SYS_ADMIN); without it the
// plays run one after another on the machine's own loopback.

import (
	"bytes"
	"encoding/json"
	"fmt"
	"os"
	"os/exec"
	"syscall"
	"unsafe"
)

// childFlag names the hidden flag a child play is started with.
const childFlag = "play-in-namespace"

// childPlay is what a child is asked to play.
type childPlay struct {
	Scenario string `json:"scenario"`
	Gen      string `json:"gen"`
	Proxy    string `json:"proxy"`
	Bin      string `json:"bin"`
	Warm     bool   `json:"warm"`
	Logs     string `json:"logs"`
	Dir      string `json:"dir"`
	// Certs is where the runner wrote the pair a TLS scenario mounts.
	Certs string `json:"certs"`
}

// childResult is what a child recorded, in order.
type childResult struct {
	Order  []string          `json:"order"`
	Fields map[string]string `json:"fields"`
}

// canIsolate tells whether this process may start children in network
// namespaces of their own: it starts one that does nothing.
func canIsolate() bool {
	self, err := os.Executable()
	if err != nil {
		return false
	}
	cmd := exec.Command(self, "-"+childFlag, "probe")
	cmd.SysProcAttr = &syscall.SysProcAttr{Cloneflags: syscall.CLONE_NEWNET}
	return cmd.Run() == nil
}

// playIsolated plays one scenario against one proxy in a child process in
// a network namespace of its own, and returns what it recorded.
func playIsolated(sc Scenario, gen string, p proxy, warm bool, logs, dir, certs string) *Observation {
	obs := NewObservation()
	self, err := os.Executable()
	if err != nil {
		obs.Set("setup", err.Error())
		return obs
	}
	arg, _ := json.Marshal(childPlay{sc.Name, gen, p.name, p.bin, warm, logs, dir, certs})
	cmd := exec.Command(self, "-"+childFlag, string(arg))
	flags := uintptr(syscall.CLONE_NEWNET)
	if sc.TLS {
		// And a mount namespace, for the certificate (tls.go).
		flags |= syscall.CLONE_NEWNS
	}
	cmd.SysProcAttr = &syscall.SysProcAttr{
		Cloneflags: flags,
		// The namespace, and whatever the play left running in it, goes
		// with the runner.
		Pdeathsig: syscall.SIGKILL,
	}
	var out, errOut bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &errOut
	if err := cmd.Run(); err != nil {
		obs.Set("setup", fmt.Sprintf("child play: %v: %s", err, bytes.TrimSpace(errOut.Bytes())))
		return obs
	}
	var res childResult
	if err := json.Unmarshal(out.Bytes(), &res); err != nil {
		obs.Set("setup", fmt.Sprintf("child play: %v", err))
		return obs
	}
	for _, n := range res.Order {
		obs.Set(n, res.Fields[n])
	}
	return obs
}

// runChild is the child's side: bring the namespace's loopback up, play,
// and print what was recorded as JSON.
func runChild(arg string) int {
	if arg == "probe" {
		if err := loopbackUp(); err != nil {
			fmt.Fprintln(os.Stderr, "conformance: loopback:", err)
			return 1
		}
		return 0
	}
	var c childPlay
	if err := json.Unmarshal([]byte(arg), &c); err != nil {
		fmt.Fprintln(os.Stderr, "conformance: child play:", err)
		return 2
	}
	if err := loopbackUp(); err != nil {
		fmt.Fprintln(os.Stderr, "conformance: loopback:", err)
		return 2
	}
	scenarios, err := LoadScenarios(c.Dir)
	if err != nil {
		fmt.Fprintln(os.Stderr, "conformance:", err)
		return 2
	}
	sc := findScenario(scenarios, c.Scenario)
	if sc == nil {
		fmt.Fprintln(os.Stderr, "conformance: no scenario", c.Scenario)
		return 2
	}
	if sc.TLS {
		if err := mountCerts(c.Certs); err != nil {
			fmt.Fprintln(os.Stderr, "conformance: mounting the certificate:", err)
			return 2
		}
	}
	obs := play(*sc, c.Gen, proxy{c.Proxy, c.Bin}, c.Warm, c.Logs)
	if err := json.NewEncoder(os.Stdout).Encode(childResult{obs.order, obs.fields}); err != nil {
		fmt.Fprintln(os.Stderr, "conformance:", err)
		return 2
	}
	return 0
}

// inNamespace runs this program with the hidden flag and arg, as JSON, in a
// child process in a network namespace of its own (gone with the runner),
// and decodes what the child prints into out: the failure-mode and
// integrity suites' plays.
func inNamespace(flag string, arg, out any) error {
	self, err := os.Executable()
	if err != nil {
		return err
	}
	doc, err := json.Marshal(arg)
	if err != nil {
		return err
	}
	cmd := exec.Command(self, "-"+flag, string(doc))
	cmd.SysProcAttr = &syscall.SysProcAttr{Cloneflags: syscall.CLONE_NEWNET, Pdeathsig: syscall.SIGKILL}
	var stdout, stderr bytes.Buffer
	cmd.Stdout, cmd.Stderr = &stdout, &stderr
	if err := cmd.Run(); err != nil {
		return fmt.Errorf("child play: %v: %s", err, bytes.TrimSpace(stderr.Bytes()))
	}
	if err := json.Unmarshal(stdout.Bytes(), out); err != nil {
		return fmt.Errorf("child play: %v", err)
	}
	return nil
}

// childSide is the child's side of inNamespace: arg decoded, the
// namespace's loopback brought up, what play returns printed as JSON; its
// errors, named by suite, exit 2.
func childSide[T any](suite, arg string, play func(T) (any, error)) int {
	var in T
	if err := json.Unmarshal([]byte(arg), &in); err != nil {
		fmt.Fprintln(os.Stderr, suite+": child play:", err)
		return 2
	}
	if err := loopbackUp(); err != nil {
		fmt.Fprintln(os.Stderr, suite+": loopback:", err)
		return 2
	}
	out, err := play(in)
	if err == nil {
		err = json.NewEncoder(os.Stdout).Encode(out)
	}
	if err != nil {
		fmt.Fprintln(os.Stderr, suite+":", err)
		return 2
	}
	return 0
}

// loopbackUp brings up the loopback interface of this process's network
// namespace (a new namespace has it down), as `ip link set lo up` does.
func loopbackUp() error {
	fd, err := syscall.Socket(syscall.AF_INET, syscall.SOCK_DGRAM|syscall.SOCK_CLOEXEC, 0)
	if err != nil {
		return err
	}
	defer syscall.Close(fd)
	// struct ifreq: the interface's name, then a union whose first member
	// here is the flags (40 bytes in all on 64-bit Linux).
	var req struct {
		name  [syscall.IFNAMSIZ]byte
		flags uint16
		_     [22]byte
	}
	copy(req.name[:], "lo")
	ioctl := func(op uintptr) error {
		if _, _, e := syscall.Syscall(syscall.SYS_IOCTL, uintptr(fd), op, uintptr(unsafe.Pointer(&req))); e != 0 {
			return e
		}
		return nil
	}
	if err := ioctl(syscall.SIOCGIFFLAGS); err != nil {
		return fmt.Errorf("reading lo's flags: %w", err)
	}
	req.flags |= syscall.IFF_UP
	if err := ioctl(syscall.SIOCSIFFLAGS); err != nil {
		return fmt.Errorf("bringing lo up: %w", err)
	}
	return nil
}
