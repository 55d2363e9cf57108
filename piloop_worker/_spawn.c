/* piloop_worker._spawn: one job's process started with clone(CLONE_VM | CLONE_VFORK), as glibc's posix_spawn does,
 * with the steps posix_spawn has no attribute for (the parent-death signal and its check, a cgroup, a user, Landlock)
 * done in the child before its exec. The reference is piloop_worker/spawn.py, the one caller.
 *
 * The child shares the parent's memory until it execs or exits, so it does only async-signal-safe system calls on
 * arrays the parent prepared (no malloc, no Python), and tells the parent which step failed, and its errno, in a
 * record in that shared memory (glibc's way; a pipe would cost four system calls a spawn). Every signal is blocked
 * in the parent across the clone, so no handler of the parent runs on the child's stack; the child sets every
 * handler back to SIG_DFL and its mask to empty before its exec.
 */
#define PY_SSIZE_T_CLEAN
#define _GNU_SOURCE
#include <Python.h>

#include <errno.h>
#include <fcntl.h>
#include <sched.h>
#include <signal.h>
#include <stdint.h>
#include <string.h>
#include <sys/prctl.h>
#include <sys/syscall.h>
#include <sys/types.h>
#include <sys/wait.h>
#include <unistd.h>

#ifndef SYS_close_range
#define SYS_close_range 436
#endif
#ifndef SYS_landlock_create_ruleset
#define SYS_landlock_create_ruleset 444
#endif
#ifndef SYS_landlock_restrict_self
#define SYS_landlock_restrict_self 446
#endif
#define LANDLOCK_ACCESS_FS_MAKE_BLOCK_ (1ULL << 11)
#ifndef PR_SET_NO_NEW_PRIVS
#define PR_SET_NO_NEW_PRIVS 38
#endif

#define STACK_SIZE (64 * 1024)

/* the steps, as spawn.py names them (STEPS there, in this order) */
enum step { S_NONE, S_SESSION, S_PGROUP, S_CGROUP, S_SETGROUPS, S_SETGID, S_SETUID, S_NO_NEW_PRIVS,
            S_PDEATHSIG, S_PARENT_GONE, S_FDS, S_CHDIR, S_EXEC };

struct job {
    char *const *programs; /* the paths to try, in order (PATH searched by the caller) */
    char *const *argv;
    char *const *envp;
    const char *cwd;   /* or NULL */
    int fds[3];        /* stdin, stdout, stderr; -1 leaves that one as it is */
    const int *keep;   /* pass_fds, sorted ascending, each >= 3 */
    int nkeep;
    int new_session;   /* else its own process group */
    int cgroup_fd;     /* cgroup.procs, or -1 */
    uid_t uid;         /* (uid_t)-1: no change */
    gid_t gid;
    const gid_t *groups;
    int ngroups;       /* -1: no setgroups */
    int isolate;       /* no_new_privs and a Landlock domain of its own */
    int pdeathsig;     /* 0: none */
    pid_t parent;
    /* written by the child, read by the parent once the clone returned */
    volatile int step;
    volatile int err;
};

__attribute__((noreturn)) static void fail(struct job *j, int step) {
    j->err = errno;
    j->step = step;
    _exit(127);
}

static int child(void *arg) {
    struct job *j = arg;
    struct sigaction dfl;
    memset(&dfl, 0, sizeof dfl);
    dfl.sa_handler = SIG_DFL;
    for (int sig = 1; sig < NSIG; sig++) {
        if (sig != SIGKILL && sig != SIGSTOP)
            (void)sigaction(sig, &dfl, NULL); /* EINVAL for libc's own signals: nothing to do */
    }
    if (j->new_session) {
        if (setsid() < 0)
            fail(j, S_SESSION);
    } else if (setpgid(0, 0) < 0) {
        fail(j, S_PGROUP);
    }
    if (j->cgroup_fd >= 0 && write(j->cgroup_fd, "0", 1) != 1)
        fail(j, S_CGROUP);
    /* as root, before the user's ids: the job's user reaches its cwd, not the dirs above it (as subprocess does) */
    if (j->cwd != NULL && chdir(j->cwd) < 0)
        fail(j, S_CHDIR);
    /* raw system calls, not glibc's wrappers: those take locks and signal every thread of the process they think
     * they run in, which in this child is the parent's memory and thread list */
    if (j->ngroups >= 0 && syscall(SYS_setgroups, (size_t)j->ngroups, j->groups) < 0)
        fail(j, S_SETGROUPS);
    if (j->gid != (gid_t)-1 && syscall(SYS_setresgid, j->gid, j->gid, j->gid) < 0)
        fail(j, S_SETGID);
    if (j->uid != (uid_t)-1 && syscall(SYS_setresuid, j->uid, j->uid, j->uid) < 0)
        fail(j, S_SETUID);
    if (j->isolate) {
        if (prctl(PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0) < 0)
            fail(j, S_NO_NEW_PRIVS);
        /* best effort, as jobuser.isolate: a kernel without Landlock leaves the job in none (the worker says so) */
        uint64_t handled = LANDLOCK_ACCESS_FS_MAKE_BLOCK_;
        long fd = syscall(SYS_landlock_create_ruleset, &handled, sizeof handled, 0);
        if (fd >= 0) {
            (void)syscall(SYS_landlock_restrict_self, fd, 0);
            close((int)fd);
        }
    }
    /* after the user's ids: a change of them clears the parent-death signal */
    if (j->pdeathsig) {
        if (prctl(PR_SET_PDEATHSIG, j->pdeathsig, 0, 0, 0) < 0)
            fail(j, S_PDEATHSIG);
        if (getppid() != j->parent) { /* the parent died before the signal was armed: none will come */
            errno = ESRCH;
            fail(j, S_PARENT_GONE);
        }
    }
    /* a source among 0-2 that an earlier dup2 would overwrite is moved out of the way first */
    int src[3];
    for (int i = 0; i < 3; i++) {
        src[i] = j->fds[i];
        if (src[i] >= 0 && src[i] < 3 && src[i] != i) {
            src[i] = fcntl(src[i], F_DUPFD_CLOEXEC, 3);
            if (src[i] < 0)
                fail(j, S_FDS);
        }
    }
    for (int i = 0; i < 3; i++) {
        if (src[i] < 0)
            continue;
        if (src[i] == i) { /* dup2 onto itself keeps FD_CLOEXEC: clear it */
            int flags = fcntl(i, F_GETFD);
            if (flags < 0 || fcntl(i, F_SETFD, flags & ~FD_CLOEXEC) < 0)
                fail(j, S_FDS);
        } else if (dup2(src[i], i) < 0) {
            fail(j, S_FDS);
        }
    }
    unsigned int from = 3;
    for (int i = 0; i < j->nkeep; i++) {
        int fd = j->keep[i];
        int flags = fcntl(fd, F_GETFD);
        if (flags < 0 || fcntl(fd, F_SETFD, flags & ~FD_CLOEXEC) < 0)
            fail(j, S_FDS);
        if ((unsigned int)fd > from && syscall(SYS_close_range, from, (unsigned int)fd - 1, 0) < 0 && errno != ENOSYS)
            fail(j, S_FDS);
        from = (unsigned int)fd + 1;
    }
    /* without close_range (Linux < 5.9) the rest close at exec: Python opens every fd close-on-exec (PEP 446) */
    if (syscall(SYS_close_range, from, ~0U, 0) < 0 && errno != ENOSYS)
        fail(j, S_FDS);
    sigset_t none;
    sigemptyset(&none);
    sigprocmask(SIG_SETMASK, &none, NULL);
    int first = 0; /* the first error other than "not here", as execvp reports */
    for (char *const *p = j->programs; *p != NULL; p++) {
        execve(*p, j->argv, j->envp);
        if (errno != ENOENT && errno != ENOTDIR && first == 0)
            first = errno;
    }
    if (first != 0)
        errno = first;
    fail(j, S_EXEC);
}

/* a sequence of str/bytes/path-likes as a NULL-ended array of C strings; the bytes objects kept in `*owned` */
static char **strings(PyObject *seq, PyObject **owned, const char *what) {
    PyObject *fast = PySequence_Fast(seq, what);
    if (fast == NULL)
        return NULL;
    Py_ssize_t n = PySequence_Fast_GET_SIZE(fast);
    *owned = PyTuple_New(n);
    char **out = PyMem_Calloc((size_t)n + 1, sizeof(char *));
    if (*owned == NULL || out == NULL) {
        Py_DECREF(fast);
        PyMem_Free(out);
        PyErr_NoMemory();
        return NULL;
    }
    for (Py_ssize_t i = 0; i < n; i++) {
        PyObject *b = NULL;
        if (!PyUnicode_FSConverter(PySequence_Fast_GET_ITEM(fast, i), &b)) {
            Py_DECREF(fast);
            PyMem_Free(out);
            return NULL;
        }
        PyTuple_SET_ITEM(*owned, i, b);
        out[i] = PyBytes_AS_STRING(b);
    }
    Py_DECREF(fast);
    return out;
}

static int ints(PyObject *seq, Py_ssize_t *n, long **out, const char *what) {
    PyObject *fast = PySequence_Fast(seq, what);
    if (fast == NULL)
        return -1;
    *n = PySequence_Fast_GET_SIZE(fast);
    *out = PyMem_Calloc((size_t)*n + 1, sizeof(long));
    if (*out == NULL) {
        Py_DECREF(fast);
        PyErr_NoMemory();
        return -1;
    }
    for (Py_ssize_t i = 0; i < *n; i++) {
        (*out)[i] = PyLong_AsLong(PySequence_Fast_GET_ITEM(fast, i));
        if ((*out)[i] == -1 && PyErr_Occurred()) {
            Py_DECREF(fast);
            return -1;
        }
    }
    Py_DECREF(fast);
    return 0;
}

PyDoc_STRVAR(spawn_doc,
"spawn(programs, argv, envp, cwd, stdin, stdout, stderr, pass_fds, new_session, cgroup_fd, uid, gid, groups,\n"
"      isolate, pdeathsig) -> (pid, step, errno)\n\n"
"Start a job's process (see piloop_worker.spawn). `programs`: the paths to exec, tried in order; `pass_fds`\n"
"sorted; -1 for an fd, uid or gid leaves it; `groups` None leaves them. A child that failed before its exec has\n"
"been reaped: pid is 0, and step (an index of spawn.STEPS) and errno say why.");

static PyObject *spawn(PyObject *self, PyObject *args) {
    (void)self;
    PyObject *programs_o, *argv_o, *envp_o, *cwd_o, *keep_o, *groups_o;
    int in, out, err, new_session, cgroup_fd, isolate, pdeathsig;
    long uid, gid;
    if (!PyArg_ParseTuple(args, "OOOOiiiOpillOpi:spawn", &programs_o, &argv_o, &envp_o, &cwd_o, &in, &out, &err,
                          &keep_o, &new_session, &cgroup_fd, &uid, &gid, &groups_o, &isolate, &pdeathsig))
        return NULL;
    PyObject *owned[4] = {NULL, NULL, NULL, NULL};
    char **programs = NULL, **argv = NULL, **envp = NULL;
    long *keep_l = NULL, *groups_l = NULL;
    int *keep = NULL;
    gid_t *groups = NULL;
    char *stack = NULL;
    PyObject *result = NULL;
    Py_ssize_t nkeep = 0, ngroups = -1;

    if ((programs = strings(programs_o, &owned[0], "programs must be a sequence")) == NULL)
        goto done;
    if ((argv = strings(argv_o, &owned[1], "argv must be a sequence")) == NULL)
        goto done;
    if ((envp = strings(envp_o, &owned[2], "envp must be a sequence")) == NULL)
        goto done;
    if (argv[0] == NULL) {
        PyErr_SetString(PyExc_ValueError, "argv must not be empty");
        goto done;
    }
    if (cwd_o != Py_None && !PyUnicode_FSConverter(cwd_o, &owned[3]))
        goto done;
    if (ints(keep_o, &nkeep, &keep_l, "pass_fds must be a sequence") < 0)
        goto done;
    keep = PyMem_Calloc((size_t)nkeep + 1, sizeof(int));
    if (keep == NULL) {
        PyErr_NoMemory();
        goto done;
    }
    for (Py_ssize_t i = 0; i < nkeep; i++) {
        if (keep_l[i] < 3 || keep_l[i] > INT_MAX || (i > 0 && keep_l[i] <= keep_l[i - 1])) {
            PyErr_SetString(PyExc_ValueError, "pass_fds must be sorted, distinct and each >= 3");
            goto done;
        }
        keep[i] = (int)keep_l[i];
    }
    if (groups_o != Py_None) {
        if (ints(groups_o, &ngroups, &groups_l, "groups must be a sequence") < 0)
            goto done;
        groups = PyMem_Calloc((size_t)ngroups + 1, sizeof(gid_t));
        if (groups == NULL) {
            PyErr_NoMemory();
            goto done;
        }
        for (Py_ssize_t i = 0; i < ngroups; i++)
            groups[i] = (gid_t)groups_l[i];
    }
    stack = PyMem_RawMalloc(STACK_SIZE);
    if (stack == NULL) {
        PyErr_NoMemory();
        goto done;
    }

    struct job j = {
        .programs = programs, .argv = argv, .envp = envp,
        .cwd = owned[3] != NULL ? PyBytes_AS_STRING(owned[3]) : NULL,
        .fds = {in, out, err}, .keep = keep, .nkeep = (int)nkeep, .new_session = new_session,
        .cgroup_fd = cgroup_fd, .uid = (uid_t)uid, .gid = (gid_t)gid, .groups = groups, .ngroups = (int)ngroups,
        .isolate = isolate, .pdeathsig = pdeathsig, .parent = getpid(), .step = S_NONE, .err = 0,
    };
    sigset_t all, old;
    sigfillset(&all);
    pthread_sigmask(SIG_BLOCK, &all, &old);
    /* the stack grows down: its top, 16-byte aligned */
    char *top = (char *)(((uintptr_t)(stack + STACK_SIZE)) & ~(uintptr_t)15);
    pid_t pid = clone(child, top, CLONE_VM | CLONE_VFORK | SIGCHLD, &j);
    int clone_errno = errno;
    pthread_sigmask(SIG_SETMASK, &old, NULL);
    if (pid < 0) {
        errno = clone_errno;
        PyErr_SetFromErrno(PyExc_OSError);
        goto done;
    }
    if (j.step != S_NONE) {
        int status;
        while (waitpid(pid, &status, 0) < 0 && errno == EINTR)
            ;
        result = Py_BuildValue("(iii)", 0, j.step, j.err);
    } else {
        result = Py_BuildValue("(iii)", (int)pid, 0, 0);
    }

done:
    for (int i = 0; i < 4; i++)
        Py_XDECREF(owned[i]);
    PyMem_Free(programs);
    PyMem_Free(argv);
    PyMem_Free(envp);
    PyMem_Free(keep_l);
    PyMem_Free(keep);
    PyMem_Free(groups_l);
    PyMem_Free(groups);
    PyMem_RawFree(stack);
    return result;
}

static PyMethodDef methods[] = {
    {"spawn", spawn, METH_VARARGS, spawn_doc},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef module = {
    PyModuleDef_HEAD_INIT, "piloop_worker._spawn", "A job's process started with clone(CLONE_VM|CLONE_VFORK): see "
    "piloop_worker.spawn.", -1, methods, NULL, NULL, NULL, NULL,
};

PyMODINIT_FUNC PyInit__spawn(void) { return PyModule_Create(&module); }
