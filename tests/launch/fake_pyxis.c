/*
 * A stand-in for NVIDIA's pyxis SPANK plugin on the Slurm test cluster (no enroot, no images here).
 * It reproduces what hpctrain's pyxis launch relies on, no more:
 * - srun takes pyxis's options (--container-image, --container-mounts, --container-workdir,
 *   --container-name, --container-env, --[no-]container-mount-home), and only with
 *   --container-image is a task started "in the image";
 * - the task then runs in a private mount namespace where no Slurm client can run (every Slurm
 *   command on the task's PATH is covered by /dev/null, SLURM_CONF is unset), as in NGC images;
 * - the image's environment: the fake image is a text file of NAME=VALUE lines standing for its
 *   /etc/environment (enroot's image format); it is shown at /etc/environment, and its values take
 *   precedence over the host's (pyxis: "their existing values in the image take precedence"),
 *   except the names given to --container-env; the rest of the host environment passes;
 * - --container-mounts SRC:DST[:FLAGS],... (flags separated by '+', "ro" read-only; DST defaults to
 *   SRC) are bind mounts, their targets created (pyxis's x-create); --container-workdir is the cwd;
 * - the image is "unpacked" (read whole and copied under runtime_path=DIR, a plugstack.conf argument
 *   as pyxis's own) once per node per step, in slurm_spank_user_init before the tasks start, as
 *   pyxis runs enroot there; tasks read only the unpacked copy. With --container-name=NAME the copy
 *   is kept as pyxis_NAME in the node's directory (pyxis's name under its default container_scope=global,
 *   in enroot's data path), and a later step with the same name skips the import (pyxis: "If a
 *   container with this name already exists, the existing container is used and the import is
 *   skipped"); nothing removes it but `enroot remove` (the fake `enroot` that tests/launch/pyxis.py
 *   writes lists and removes the node's copies); unnamed copies are removed when the step ends.
 * Built by tests/launch/pyxis.py against Debian's libslurm-dev; loaded through plugstack.conf.
 */
#define _GNU_SOURCE
#include <errno.h>
#include <fcntl.h>
#include <sched.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mount.h>
#include <sys/stat.h>
#include <unistd.h>

#include <slurm/spank.h>

SPANK_PLUGIN(fake_pyxis, 1);

static char *image, *mounts, *workdir, *host_env, *name;
static char runtime_path[1024] = "/tmp/fake-pyxis";
static char unpacked[4096]; /* this node's unpacked copy of the image (its /etc/environment) */

static int set_str(char **dst, const char *optarg)
{
	if (optarg == NULL || *optarg == '\0')
		return -1;
	free(*dst);
	*dst = strdup(optarg);
	return *dst ? 0 : -1;
}

static int opt_image(int val, const char *optarg, int remote) { return set_str(&image, optarg); }
static int opt_mounts(int val, const char *optarg, int remote) { return set_str(&mounts, optarg); }
static int opt_workdir(int val, const char *optarg, int remote) { return set_str(&workdir, optarg); }
static int opt_env(int val, const char *optarg, int remote) { return set_str(&host_env, optarg); }
static int opt_name(int val, const char *optarg, int remote) { return set_str(&name, optarg); }
static int opt_ignored(int val, const char *optarg, int remote) { return 0; }

struct spank_option spank_options[] = {
	{"container-image", "[USER@][REGISTRY#]IMAGE[:TAG]|PATH", "[fake pyxis] the image", 1, 0, opt_image},
	{"container-mounts", "SRC:DST[:FLAGS][,SRC:DST...]", "[fake pyxis] bind mounts", 1, 0, opt_mounts},
	{"container-workdir", "PATH", "[fake pyxis] working directory inside", 1, 0, opt_workdir},
	{"container-name", "NAME", "[fake pyxis] keep the unpacked image under NAME, reuse it", 1, 0, opt_name},
	{"container-env", "NAME[,NAME...]", "[fake pyxis] host values win for these", 1, 0, opt_env},
	{"container-mount-home", NULL, "[fake pyxis] accepted, not used", 0, 1, opt_ignored},
	{"no-container-mount-home", NULL, "[fake pyxis] accepted, not used", 0, 0, opt_ignored},
	SPANK_OPTIONS_TABLE_END
};

static int mkdirs(const char *path)
{
	char buf[4096];
	snprintf(buf, sizeof(buf), "%s", path);
	for (char *p = buf + 1; *p; p++) {
		if (*p == '/') {
			*p = '\0';
			if (mkdir(buf, 0755) < 0 && errno != EEXIST)
				return -1;
			*p = '/';
		}
	}
	return (mkdir(buf, 0755) < 0 && errno != EEXIST) ? -1 : 0;
}

static int bind_mount(const char *src, const char *dst, int ro)
{
	if (mount(src, dst, NULL, MS_BIND | MS_REC, NULL) < 0) {
		slurm_error("fake pyxis: mount %s at %s: %s", src, dst, strerror(errno));
		return -1;
	}
	if (ro && mount(NULL, dst, NULL, MS_REMOUNT | MS_BIND | MS_RDONLY, NULL) < 0) {
		slurm_error("fake pyxis: remount %s read-only: %s", dst, strerror(errno));
		return -1;
	}
	return 0;
}

static int do_mounts(void)
{
	if (mounts == NULL)
		return 0;
	char *all = strdup(mounts), *rest = all, *entry;
	int rc = 0;
	while (rc == 0 && (entry = strsep(&rest, ",")) != NULL) {
		char *src = strsep(&entry, ":"), *dst = entry ? strsep(&entry, ":") : NULL, *flags = entry;
		if (dst == NULL || *dst == '\0')
			dst = src;
		int ro = 0;
		for (char *f; flags && (f = strsep(&flags, "+")) != NULL;)
			ro |= strcmp(f, "ro") == 0;
		struct stat st;
		if (stat(src, &st) < 0) {
			slurm_error("fake pyxis: mount source %s: %s", src, strerror(errno));
			rc = -1;
		} else if (S_ISDIR(st.st_mode) ? mkdirs(dst) : 0) {
			slurm_error("fake pyxis: cannot create %s", dst);
			rc = -1;
		} else {
			rc = bind_mount(src, dst, ro);
		}
	}
	free(all);
	return rc;
}

static const char *SLURM_CMDS[] = {"scontrol", "sbatch", "squeue", "sacct", "srun", "scancel", "sinfo", "salloc",
				   NULL};

static void mask_slurm(spank_t sp)
{
	char path[8192];
	if (spank_getenv(sp, "PATH", path, sizeof(path)) != ESPANK_SUCCESS)
		snprintf(path, sizeof(path), "/usr/local/bin:/usr/bin:/bin");
	char *rest = path, *dir;
	while ((dir = strsep(&rest, ":")) != NULL) {
		for (const char **c = SLURM_CMDS; *c; c++) {
			char file[4096];
			snprintf(file, sizeof(file), "%s/%s", dir, *c);
			if (access(file, F_OK) == 0)
				mount("/dev/null", file, NULL, MS_BIND, NULL);
		}
	}
}

static int in_list(const char *name, const char *list)
{
	if (list == NULL)
		return 0;
	size_t n = strlen(name);
	for (const char *p = list; (p = strstr(p, name)) != NULL; p += n)
		if ((p == list || p[-1] == ',') && (p[n] == ',' || p[n] == '\0'))
			return 1;
	return 0;
}

int slurm_spank_init(spank_t sp, int ac, char **av)
{
	for (int i = 0; i < ac; i++)
		if (strncmp(av[i], "runtime_path=", 13) == 0)
			snprintf(runtime_path, sizeof(runtime_path), "%s", av[i] + 13);
	return 0;
}

static int copy_file(const char *src, const char *dst)
{
	char buf[65536];
	ssize_t n = 0;
	int in = open(src, O_RDONLY), out = in < 0 ? -1 : open(dst, O_WRONLY | O_CREAT | O_TRUNC, 0644);
	while (out >= 0 && (n = read(in, buf, sizeof(buf))) > 0)
		if (write(out, buf, n) != n)
			n = -1;
	int rc = (in < 0 || out < 0 || n < 0) ? -1 : 0;
	if (in >= 0)
		close(in);
	if (out >= 0)
		close(out);
	return rc;
}

/* Once per node and step, before the tasks: the import (skipped when the named container exists). */
int slurm_spank_user_init(spank_t sp, int ac, char **av)
{
	if (!spank_remote(sp) || image == NULL)
		return 0;
	char host[256], dir[2048];
	uint32_t job = 0, step = 0;
	uid_t uid = 0;
	gethostname(host, sizeof(host));
	spank_get_item(sp, S_JOB_ID, &job);
	spank_get_item(sp, S_JOB_STEPID, &step);
	/* the job user's own directory, as enroot's data path (the fake `enroot` names it by `id -u`):
	 * slurmstepd's real uid stays root here (getuid() is 0 for every user's job), so a directory named
	 * by it was made by whichever job came first and refused the next user's import (EACCES) */
	if (spank_get_item(sp, S_JOB_UID, &uid) != ESPANK_SUCCESS) {
		slurm_error("fake pyxis: the job's uid is unknown");
		return -1;
	}
	snprintf(dir, sizeof(dir), "%s/%u/%s", runtime_path, (unsigned)uid, host);
	if (mkdirs(dir) < 0) {
		slurm_error("fake pyxis: cannot create %s", dir);
		return -1;
	}
	if (name)
		snprintf(unpacked, sizeof(unpacked), "%s/pyxis_%s", dir, name);
	else
		snprintf(unpacked, sizeof(unpacked), "%s/.unnamed-%u.%u", dir, job, step);
	if (name && access(unpacked, F_OK) == 0)
		return 0;
	char part[4200];
	snprintf(part, sizeof(part), "%s.part", unpacked);
	if (copy_file(image, part) < 0 || rename(part, unpacked) < 0) {
		slurm_error("fake pyxis: import of %s: %s", image, strerror(errno));
		return -1;
	}
	return 0;
}

int slurm_spank_exit(spank_t sp, int ac, char **av)
{
	if (spank_remote(sp) && image && !name && unpacked[0])
		unlink(unpacked);
	return 0;
}

static int image_env(spank_t sp)
{
	FILE *f = fopen(unpacked, "r");
	if (f == NULL) {
		slurm_error("fake pyxis: unpacked image %s: %s", unpacked, strerror(errno));
		return -1;
	}
	char line[8192];
	while (fgets(line, sizeof(line), f)) {
		line[strcspn(line, "\n")] = '\0';
		char *eq = strchr(line, '=');
		if (line[0] == '#' || eq == NULL)
			continue;
		*eq = '\0';
		if (!in_list(line, host_env))
			spank_setenv(sp, line, eq + 1, 1);
	}
	fclose(f);
	spank_unsetenv(sp, "SLURM_CONF");
	return 0;
}

/* In each task before Slurm drops to the job's user (spank(8): task_init_privileged): an ordinary
 * user's task may not make a mount namespace (pyxis joins the container's namespaces as root too). */
int slurm_spank_task_init_privileged(spank_t sp, int ac, char **av)
{
	if (!spank_remote(sp) || image == NULL)
		return 0;
	if (unshare(CLONE_NEWNS) < 0 || mount(NULL, "/", NULL, MS_REC | MS_PRIVATE, NULL) < 0) {
		slurm_error("fake pyxis: private mount namespace: %s", strerror(errno));
		return -1;
	}
	mask_slurm(sp);
	return do_mounts() < 0 || bind_mount(unpacked, "/etc/environment", 1) < 0 ? -1 : 0;
}

/* As the job's user, once slurmstepd has set up the task's environment and gone to the job's working
 * directory: the image's environment (its values win, SLURM_CONF goes) and working directory. */
int slurm_spank_task_init(spank_t sp, int ac, char **av)
{
	if (!spank_remote(sp) || image == NULL)
		return 0;
	if (image_env(sp) < 0)
		return -1;
	if (workdir && chdir(workdir) < 0) {
		slurm_error("fake pyxis: --container-workdir %s: %s", workdir, strerror(errno));
		return -1;
	}
	return 0;
}
